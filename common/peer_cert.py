"""The verified TLS client certificate of an HTTP request, for any of our uvicorn servers.

Uvicorn does not put the peer certificate into the ASGI scope. ``PeerCertH11Protocol`` is a
small subclass of uvicorn's h11 protocol that, once per connection (asyncio calls
``connection_made`` after the handshake), reads the verified peer certificate from the SSL
object and wraps the connection's ASGI app so every request on that connection carries it in
``scope["extensions"]["tls"]`` in the shape of the ASGI TLS extension (``client_cert_chain``
as PEM, ``client_cert_name``), plus ``fabric_client_cn``, ``fabric_client_role`` (common.pki's
role, None without one) and ``fabric_client_issued`` (when it was signed, UNIX seconds: what a
revocation compares with). It relies only on uvicorn's
``self.app`` attribute and the asyncio protocol method, not on uvicorn's request internals.
Serve with ``uvicorn.Config(app, ssl_..., http=PeerCertH11Protocol)``.

Only a certificate the handshake verified reaches the app: with CERT_OPTIONAL or CERT_REQUIRED
and a CA, the TLS layer already refused one that does not chain to that CA. fabricd uses this
to know which node calls it (controlplane/node_identity.py); the agent uses it to admit only
the control plane (agent/api/callers.py).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, cast

from uvicorn.protocols.http.h11_impl import H11Protocol

from common.pki import LEAF_BACKDATE_S, peer_common_name, peer_role

TLS_EXT = "tls"
CN_KEY = "fabric_client_cn"
ROLE_KEY = "fabric_client_role"
ISSUED_KEY = "fabric_client_issued"


def peer_tls_extension(ssl_object: ssl.SSLObject | None) -> dict | None:
    """The ASGI TLS extension dict for a connection, or None when it is not TLS."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    # getpeercert() (parsed) is only filled for a certificate the handshake verified.
    parsed = ssl_object.getpeercert() if der else None
    ext: dict = {"client_cert_chain": [], "client_cert_name": None, "client_cert_error": None,
                 "tls_version": None, "cipher_suite": None, CN_KEY: None, ROLE_KEY: None, ISSUED_KEY: None}
    if der and parsed:
        ext["client_cert_chain"] = [ssl.DER_cert_to_PEM_cert(der)]
        ext["client_cert_name"] = ",".join(
            f"{k}={v}" for rdn in cast(Any, parsed).get("subject", ()) for k, v in rdn
        )
        ext[CN_KEY] = peer_common_name(parsed)
        ext[ROLE_KEY] = peer_role(parsed)
        ext[ISSUED_KEY] = ssl.cert_time_to_seconds(str(parsed["notBefore"])) + LEAF_BACKDATE_S
    return ext


def _with_tls(app, tls: dict):
    async def wrapped(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            scope = dict(scope)
            scope["extensions"] = {**(scope.get("extensions") or {}), TLS_EXT: tls}
        await app(scope, receive, send)

    return wrapped


class PeerCertH11Protocol(H11Protocol):
    """uvicorn h11 protocol that exposes the verified client certificate to the app."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        tls = peer_tls_extension(transport.get_extra_info("ssl_object"))
        if tls is not None:
            self.app = _with_tls(self.app, tls)


def scope_tls(scope: Mapping[str, Any]) -> dict | None:
    """The TLS extension PeerCertH11Protocol put into an ASGI scope; None when absent."""
    return (scope.get("extensions") or {}).get(TLS_EXT)


def scope_client_cn(scope: Mapping[str, Any]) -> str | None:
    """The verified client certificate's common name, or None (no TLS or no certificate)."""
    tls = scope_tls(scope)
    return None if not tls else tls.get(CN_KEY)


def scope_client_role(scope: Mapping[str, Any]) -> str | None:
    """The verified client certificate's role (common.pki.ROLES), or None."""
    tls = scope_tls(scope)
    return None if not tls else tls.get(ROLE_KEY)


def scope_client_issued(scope: Mapping[str, Any]) -> float:
    """When the verified client certificate was signed (UNIX seconds); 0 without one."""
    tls = scope_tls(scope)
    return float((tls or {}).get(ISSUED_KEY) or 0)
