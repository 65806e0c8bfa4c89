"""Revoking fabricd tokens before they expire: by user (a generation number) and one by one (logout).

A token is an HS256 JWT checked without the store, so on its own it stays valid until it
expires. Two records in the store take it back earlier:

  - ``keyspace.auth("generation/{subject}")``: the subject's generation, 0 when absent. A token
    carries the generation it was issued under (claim ``gen``); it is refused once the stored one
    is higher. Deleting a user bumps it, so the user's tokens stop at once (and a user re-created
    under the same name never revives them);
  - ``keyspace.auth("revoked/{jti}")``: one token, revoked by logging out (the console's sign-out,
    POST /api/auth/logout); written under a lease that ends when the token would have expired.

``require_admin`` checks both on every call (two store reads); a refused token is 401
"token_revoked".
"""

from __future__ import annotations

import time

from common.errors import Unauthorized
from common.records import auth_tokens
from common.store.base import Store

MAX_SUBJECT = auth_tokens.MAX_SUBJECT


def generation(store: Store, subject: str) -> int:
    return auth_tokens.generation(store, subject)


def revoke_subject(store: Store, subject: str) -> int:
    """Every token issued to ``subject`` so far stops working; returns the new generation."""
    return auth_tokens.bump_generation(store, subject)


def revoke_token(store: Store, jti: str, expires_at: float, now: float | None = None) -> None:
    """This one token stops working (until its expiry, when the record goes with its lease)."""
    now = time.time() if now is None else now
    ttl = int(expires_at - now) + 1
    if ttl <= 0 or not jti:
        return
    auth_tokens.revoke_jti(store, jti, ttl)


def check(store: Store, claims: dict) -> None:
    """Unauthorized "token_revoked" when the token's subject was revoked after it was issued, or
    the token itself was."""
    gen = claims.get("gen", 0)
    if not isinstance(gen, int) or gen < generation(store, str(claims.get("sub", ""))):
        raise Unauthorized("this token was revoked; log in again", code="token_revoked")
    jti = claims.get("jti")
    if isinstance(jti, str) and auth_tokens.jti_revoked(store, jti):
        raise Unauthorized("this token was revoked (logged out); log in again", code="token_revoked")
