"""How fabricd knows that a caller is node X: a client certificate from the cluster CA whose
common name equals X, whose role (common.pki) is ``node``, and that was not revoked
(controlplane.node_certs: `fabricctl ai node delete`). A gateway's, fabricd's or a tool's
certificate is no node's, whatever its CN.

The choice: one HTTPS listener with ``ssl.CERT_OPTIONAL`` (common.pki.server_ssl_context with
``ca=`` and ``require_client_cert=False``), so operators keep using bearer tokens without a
certificate while agents present their node certificate. With CERT_OPTIONAL the TLS handshake
already refuses a certificate that does not chain to the cluster CA, so a certificate that
reaches the application has been verified.

The peer certificate reaches the app through ``common.peer_cert.PeerCertH11Protocol`` (uvicorn
does not put it into the ASGI scope; see that module). ``uvicorn_tls_kwargs`` serves fabricd
with it.

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

from common.errors import Forbidden, Unauthorized
from common.peer_cert import (
    CN_KEY,
    TLS_EXT,
    PeerCertH11Protocol,
    peer_tls_extension,
    scope_client_cn,
    scope_client_issued,
    scope_client_role,
)
from common.pki import ROLE_NODE, server_ssl_context
from controlplane.node_certs import check_not_revoked
from controlplane.state import AppState, get_state

NODE_CERT_REQUIRED = ("a node certificate from the cluster CA is required to act as a node "
                      "(issue one with `fabricctl ai node add NAME`)")

# Re-exported: callers that served fabricd with these before they moved to common.peer_cert.
__all__ = ["CN_KEY", "TLS_EXT", "PeerCertH11Protocol", "authenticate_node", "peer_node_cn",
           "peer_tls_extension", "require_node", "uvicorn_tls_kwargs"]


def uvicorn_tls_kwargs(cert: Path, key: Path, ca: Path) -> dict:
    """Keyword arguments for uvicorn.Config: TLS with optional, CA-verified client certs."""
    server_ssl_context(cert, key, ca)  # fail early, with a clear error, if the files are bad
    # uvicorn builds its SSLContext from these files; CERT_OPTIONAL verifies a presented cert.
    return {"http": PeerCertH11Protocol, "ssl_certfile": str(cert), "ssl_keyfile": str(key),
            "ssl_ca_certs": str(ca), "ssl_cert_reqs": int(ssl.CERT_OPTIONAL)}


def peer_node_cn(request: Request) -> str | None:
    return scope_client_cn(request.scope)


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
        raise Unauthorized(NODE_CERT_REQUIRED, code="no_node_certificate")
    if scope_client_role(request.scope) != ROLE_NODE:
        raise Forbidden("this certificate is not a node's (its role is not node); nodes join with "
                        "`fabric-agent join` or get one from `fabricctl ai node add`", code="not_a_node_certificate")
    if cn != claimed:
        raise Forbidden(f"this certificate does not belong to node {claimed}", code="wrong_node")
    check_not_revoked(state.store, cn, scope_client_issued(request.scope))
    return cn


def require_node(node_id: str, request: Request, state: Annotated[AppState, Depends(get_state)]) -> str:
    """Route dependency for /api/ai/nodes/{node_id}/...: the caller is that node."""
    return authenticate_node(request, state, node_id)
