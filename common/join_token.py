"""The node join token's text form, read the same way by fabricd and the agent.

    fjt1.<id>.<secret>.<sha256 of the cluster CA certificate, DER, hex>

controlplane.join_tokens makes and checks tokens; agent.join uses the CA hash to check the CA it
downloads before it trusts it.
"""

from __future__ import annotations

TOKEN_VERSION = "fjt1"


class BadJoinToken(ValueError):
    """Not a join token (wrong shape or version)."""


def parse_token(token: str) -> tuple[str, str, str]:
    """(id, secret, ca sha256) of a token string."""
    parts = (token or "").strip().split(".")
    if len(parts) != 4 or parts[0] != TOKEN_VERSION or not all(parts):
        raise BadJoinToken(f"not a Fabric join token (expected {TOKEN_VERSION}.ID.SECRET.CA_SHA256)")
    return parts[1], parts[2], parts[3]


def format_token(token_id: str, secret: str, ca_sha256: str) -> str:
    return f"{TOKEN_VERSION}.{token_id}.{secret}.{ca_sha256}"
