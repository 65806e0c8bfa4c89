"""JSON Web Key Sets as both OIDC verifiers read them (gateway/oidc.py for inference callers,
controlplane/tenancy/oidc_login.py for control-plane logins): the signature algorithms we accept,
how long a fetched key set may be used (its Cache-Control max-age, bounded), and which keys of a
set are usable. Pure; fetching and caching stay with each process (async in the gateway, sync in
fabricd's one-shot login exchange).
"""

from __future__ import annotations

import re

import jwt

ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]  # never HS*, never none
DEFAULT_TTL = 300.0
MIN_TTL, MAX_TTL = 10.0, 86400.0
MAX_KEYS = 100
_MAX_AGE = re.compile(r"max-age\s*=\s*(\d+)", re.IGNORECASE)


def ttl_of(cache_control: str | None, now_ttl: float = DEFAULT_TTL) -> float:
    """The key set's lifetime from a Cache-Control header (no-store/no-cache: the minimum)."""
    if not cache_control:
        return now_ttl
    cc = cache_control.lower()
    if "no-store" in cc or "no-cache" in cc:
        return MIN_TTL
    m = _MAX_AGE.search(cc)
    return min(MAX_TTL, max(MIN_TTL, float(m.group(1)))) if m else now_ttl


def parse_key_set(doc: object) -> dict[str, jwt.PyJWK]:
    """kid -> key for the usable keys of a JWKS document (at most MAX_KEYS; others skipped)."""
    keys: dict[str, jwt.PyJWK] = {}
    items = doc.get("keys") if isinstance(doc, dict) else None
    for item in (items if isinstance(items, list) else [])[:MAX_KEYS]:
        try:
            k = jwt.PyJWK(item)
        except (jwt.PyJWTError, jwt.PyJWKError, ValueError, TypeError, KeyError):
            continue  # a key we cannot use (an unknown type, an encryption key) is skipped
        keys[str(item.get("kid", ""))] = k
    return keys
