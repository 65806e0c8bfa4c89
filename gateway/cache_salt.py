"""The ``cache_salt`` of every call that reaches a replica's engine (issues 37 and 50): vLLM shares
prefix-cache blocks only between requests with the same salt, so one tenant cannot time another's
cached prompts.

One function makes the salt, ``salt_for``: HMAC-SHA256 under the gateway's key HMAC secret
(FABRIC_KEY_HMAC_SECRET, the same on every gateway) of the tenant (a credential without one: its
own subject) and the salt the client sent, if any. Keyed, so nobody without the secret can compute
a tenant's salt; the client's salt is combined, never passed through alone, so a client may split
its own tenant's cache further but can never name another tenant's. The message starts with a
domain tag, so no salt equals a key's digest under the same secret.

Salted: every POST that reaches an engine with a JSON body and shares its prefix cache -- the
generating routes (chat/completions, completions, responses, messages, and any POST route not known
to be non-generating: gateway.routes ``generate``) and the pooling ones (POOLING_ROUTES). The parsed
body carries the salt too, so the routing hash (gateway.engine_hash) folds it in as vLLM does.
External providers get the body unsalted (cache_salt is vLLM's field).
"""

from __future__ import annotations

import hmac
from dataclasses import replace
from hashlib import sha256

from gateway.request_body import BodyInfo, with_field
from gateway.routes import Route

# vLLM's pooling requests take cache_salt too (embeddings share the prefix cache).
POOLING_ROUTES = ("/v1/embeddings", "/pooling", "/v1/pooling", "/classify", "/v1/classify", "/score", "/v1/score",
                  "/rerank", "/v1/rerank", "/v2/rerank")
_TAG = b"fabric-cache-salt\x00"


def salt_for(secret: bytes, tenant: str | None, subject: str, client_salt: str | None = None) -> str:
    who = f"t:{tenant}" if tenant else f"c:{subject}"
    msg = _TAG + who.encode() + b"\x00" + (client_salt or "").encode()
    return hmac.new(secret, msg, sha256).hexdigest()


def salts(route: Route) -> bool:
    """Whether calls on this route carry a salt (module docstring)."""
    return route.kind == "generate" or route.startswith(*POOLING_ROUTES)


def salted(info: BodyInfo, body: bytes, route: Route, secret: bytes, tenant: str | None, subject: str) -> BodyInfo:
    """``info`` with the forwarded body (and its parsed data) carrying the caller's salt."""
    data = info.data
    if data is None or not salts(route):
        return info
    sent = data.get("cache_salt")
    salt = salt_for(secret, tenant, subject, sent if isinstance(sent, str) else None)
    forwarded = info.body if info.body is not None else body
    return replace(info, body=with_field(forwarded, data, "cache_salt", salt), data={**data, "cache_salt": salt})
