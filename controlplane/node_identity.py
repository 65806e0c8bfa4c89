"""How fabricd knows that a caller is node X: a client certificate from the cluster CA whose
common name equals X.

The choice: one HTTPS listener with ``ssl.CERT_OPTIONAL`` (common.pki.server_ssl_context with
``ca=`` and ``require_client_cert=False``), so operators keep using bearer tokens without a
certificate while agents present their node certificate. With CERT_OPTIONAL the TLS handshake
already refuses a certificate that does not chain to the cluster CA, so a certificate that
reaches the application has been verified.

Uvicorn does not put the peer certificate into the ASGI scope. ``PeerCertH11Protocol`` is a
small subclass of uvicorn's h11 protocol that, once per connection (asyncio calls
``connection_made`` after the handshake), reads the verified peer certificate from the SSL
object and wraps the connection's ASGI app so every request on that connection carries it in
``scope["extensions"]["tls"]`` in the shape of the ASGI TLS extension (``client_cert_chain``
as PEM, ``client_cert_name``), plus ``fabric_client_cn``. It relies only on uvicorn's
``self.app`` attribute and the asyncio protocol method, not on uvicorn's request internals.
Serve fabricd with ``uvicorn.Config(app, ssl_..., http=PeerCertH11Protocol)`` or use
``uvicorn_tls_kwargs``.

Without TLS (``fabricd serve --insecure``, loopback only) there is no certificate; then, and
only then, a node may register or heartbeat from a loopback peer by naming itself. This is the
lab's all-in-one mode and is refused whenever fabricd serves TLS.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from common.errors import Forbidden, Unauthorized
from common.pki import peer_common_name, server_ssl_context
from controlplane.state import AppState, get_state

TLS_EXT = "tls"
CN_KEY = "fabric_client_cn"


def peer_tls_extension(ssl_object: ssl.SSLObject | None) -> dict | None:
    """The ASGI TLS extension dict for a connection, or None when it is not TLS."""
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    # getpeercert() (parsed) is only filled for a certificate the handshake verified.
    parsed = ssl_object.getpeercert() if der else None
    ext: dict = {"client_cert_chain": [], "client_cert_name": None, "client_cert_error": None,
                 "tls_version": None, "cipher_suite": None, CN_KEY: None}
    if der and parsed:
        ext["client_cert_chain"] = [ssl.DER_cert_to_PEM_cert(der)]
        ext["client_cert_name"] = ",".join(
            f"{k}={v}" for rdn in parsed.get("subject", ()) for k, v in rdn
        )
        ext[CN_KEY] = peer_common_name(parsed)
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

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        tls = peer_tls_extension(transport.get_extra_info("ssl_object"))
        if tls is not None:
            self.app = _with_tls(self.app, tls)


def uvicorn_tls_kwargs(cert: Path, key: Path, ca: Path) -> dict:
    """Keyword arguments for uvicorn.Config: TLS with optional, CA-verified client certs."""
    server_ssl_context(cert, key, ca)  # fail early, with a clear error, if the files are bad
    # uvicorn builds its SSLContext from these files; CERT_OPTIONAL verifies a presented cert.
    return {"http": PeerCertH11Protocol, "ssl_certfile": str(cert), "ssl_keyfile": str(key),
            "ssl_ca_certs": str(ca), "ssl_cert_reqs": int(ssl.CERT_OPTIONAL)}


def peer_node_cn(request: Request) -> str | None:
    tls = (request.scope.get("extensions") or {}).get(TLS_EXT)
    return None if not tls else tls.get(CN_KEY)


def _loopback(request: Request) -> bool:
    client = request.client
    if client is None:
        return False
    try:
        return ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return False


def authenticate_node(request: Request, state: AppState, claimed: str) -> str:
    """The node id the caller proves, which must equal ``claimed``; else 401/403.

    Never names the certificate's CN in the message beyond what the caller already sent.
    """
    cn = peer_node_cn(request)
    if cn is None:
        if request.url.scheme == "http" and state.settings.insecure and _loopback(request):
            return claimed
        raise Unauthorized("a node certificate from the cluster CA is required to act as a node "
                           "(issue one with `fabricctl ai node add NAME`)", code="no_node_certificate")
    if cn != claimed:
        raise Forbidden(f"this certificate does not belong to node {claimed}", code="wrong_node")
    return cn


def require_node(node_id: str, request: Request, state: Annotated[AppState, Depends(get_state)]) -> str:
    """Route dependency for /api/ai/nodes/{node_id}/...: the caller is that node."""
    return authenticate_node(request, state, node_id)
