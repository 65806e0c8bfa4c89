"""What crosses to and from a provider outside the cluster (issues 37, 50): only an allow-list of
the client's headers goes out, and only an allow-list of the provider's comes back. Inside the cluster a replica gets every header but the credentials
(gateway.proxy.upstream_headers); a provider gets none of the caller's identifying ones
(x-user-id, x-project-id, x-session-id, user-agent, the SDK's x-stainless-* platform headers,
cookies, forwarded-for) -- only what shapes the answer, and the gateway's own x-request-id.
The provider key is added by gateway.external.

Back to the caller (``RESPONSE_ALLOWED``): only what frames and describes the answer. The
provider's other headers describe the platform's account, not the caller's call -- set-cookie,
openai-organization / openai-project, the account's x-ratelimit-* (the gateway sends the
caller's own limits, gateway.ratelimit_headers), server and tracing ids -- and never reach it.
"""

from __future__ import annotations

ALLOWED = frozenset({b"content-type", b"accept", b"openai-beta", b"idempotency-key", b"x-request-id"})


def provider_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() in ALLOWED]


RESPONSE_ALLOWED = frozenset({b"content-type", b"content-length", b"content-encoding", b"cache-control",
                              b"retry-after", b"x-request-id"})
