"""The records behind fabricd's bearer tokens, under keyspace.auth(): the HMAC secret shared by
every fabricd on a store (hex, created once by the first to ask), each subject's generation (a
decimal counter: tokens issued below it are revoked) and revoked token ids (leased until the
token's own expiry). Plain text values, not JSON: each write is checked for its form here."""

from __future__ import annotations

import secrets

from common import keyspace
from common.records import cas
from common.store.base import KV, Store

SECRET_KEY = keyspace.auth("token-secret")
MAX_SUBJECT = 300
MAX_JTI = 64


def token_secret(store: Store) -> bytes:
    """The shared secret; the first caller on a store makes it (create-if-absent)."""
    store.create(SECRET_KEY, secrets.token_hex(32))
    kv = store.get(SECRET_KEY)
    if kv is None:  # only if someone deleted it between our two calls
        raise RuntimeError("token secret vanished from the store")
    return bytes.fromhex(kv.value)


def _generation_key(subject: str) -> str:
    return keyspace.auth(f"generation/{subject[:MAX_SUBJECT]}")


def generation(store: Store, subject: str) -> int:
    """The subject's generation (0: never revoked, or a value that is not a number)."""
    kv = store.get(_generation_key(subject))
    try:
        return int(kv.value) if kv is not None else 0
    except ValueError:
        return 0


def bump_generation(store: Store, subject: str) -> int:
    """Add one to the subject's generation (CAS); the new value. cas.Contended when it kept changing."""
    written: list[int] = []

    def bump(kv: KV | None) -> str:
        written[:] = [(int(kv.value) if kv is not None and kv.value.isdigit() else 0) + 1]
        return str(written[0])

    cas.swap(store, _generation_key(subject), bump, busy=f"the generation of {subject!r} changed too often; try again")
    return written[0]


def _revoked_key(jti: str) -> str:
    return keyspace.auth(f"revoked/{jti[:MAX_JTI]}")


def revoke_jti(store: Store, jti: str, ttl_s: int) -> None:
    """Mark one token id revoked for ``ttl_s`` seconds (the record goes with its lease)."""
    if not jti or ttl_s <= 0:
        raise ValueError("a revoked token needs an id and a positive ttl")
    lease = store.grant_lease(ttl_s)
    store.put(_revoked_key(jti), "1", lease=lease.id)


def jti_revoked(store: Store, jti: str) -> bool:
    return store.get(_revoked_key(jti)) is not None
