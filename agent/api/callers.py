"""Who may call the agent: a pure rule over the request's TLS scope, and the middleware that applies it.

TLS admits only certificates from the cluster CA, and every node holds such a certificate, so the
rule also checks the certificate's common name against ``allowed`` (default ``fabricd``) and its
role (common.pki: ``fabricd``, or ``tool`` for an operator's extra CN). The CNs in
``kv_index_cns`` (default ``fabric-gateway``, role ``gateway``) may call /v1/kv-index/* and
nothing else. Plain HTTP (``--insecure``, loopback only) has no certificate to check.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from common.errors import Forbidden
from common.peer_cert import CN_KEY, ROLE_KEY, scope_tls
from common.pki import ROLE_FABRICD, ROLE_GATEWAY, ROLE_TOOL

DEFAULT_ALLOWED_CLIENT_CNS = ("fabricd",)
DEFAULT_KV_INDEX_CNS = ("fabric-gateway",)  # read-only: the KV index and tokenizers (docs/kv-events.md)
KV_INDEX_PATH = "/v1/kv-index"


def caller_refusal(scope: Mapping[str, Any], allowed: Collection[str],
                   kv_index_cns: Collection[str] = ()) -> str | None:
    """Why this request's caller may not use the agent, or None when it may (a pure check).
    ``kv_index_cns`` may call the KV-index routes only."""
    if scope.get("scheme") not in ("https", "wss"):
        return None  # plain HTTP: `--insecure`, which binds loopback only
    tls = scope_tls(scope)
    if tls is None:
        return ("this agent cannot see client certificates, so it admits nobody over TLS: "
                "serve it with common.peer_cert.PeerCertH11Protocol (fabric-agent serve does)")
    cn = tls.get(CN_KEY)
    who = ", ".join(sorted(allowed)) or "nobody"
    if cn is None:
        return f"a client certificate is required; only the control plane ({who}) may call this agent"
    path = scope.get("path", "")
    role = tls.get(ROLE_KEY)
    if (cn in kv_index_cns and role == ROLE_GATEWAY
            and (path == KV_INDEX_PATH or path.startswith(KV_INDEX_PATH + "/"))):
        return None
    if cn not in allowed or role not in (ROLE_FABRICD, ROLE_TOOL):
        return (f"certificate CN {cn!r} (role {role or 'none'}) may not call this agent; only the control "
                f"plane ({who}, role fabricd or tool) may (fabric-agent serve --allowed-client-cn)")
    return None


def refuse_other_callers(app: FastAPI, allowed: Collection[str], kv_index_cns: Collection[str]) -> None:
    """A 403 ``caller_not_allowed`` for every request ``caller_refusal`` refuses, before any route runs."""
    allowed_set, kv_readers = frozenset(allowed), frozenset(kv_index_cns)

    @app.middleware("http")
    async def _only_the_control_plane(request: Request, call_next):
        refusal = caller_refusal(request.scope, allowed_set, kv_readers)
        if refusal is not None:
            return JSONResponse(Forbidden(refusal, code="caller_not_allowed").to_body(), status_code=403)
        return await call_next(request)
