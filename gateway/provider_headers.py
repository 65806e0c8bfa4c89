"""What leaves for a provider outside the cluster (issue 37): only an allow-list of the
client's headers. Inside the cluster a replica gets every header but the credentials
(gateway.proxy.upstream_headers); a provider gets none of the caller's identifying ones
(x-user-id, x-project-id, x-session-id, user-agent, the SDK's x-stainless-* platform headers,
cookies, forwarded-for) -- only what shapes the answer, and the gateway's own x-request-id.
The provider key is added by gateway.external.
"""

from __future__ import annotations

ALLOWED = frozenset({b"content-type", b"accept", b"openai-beta", b"idempotency-key", b"x-request-id"})


def provider_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() in ALLOWED]
