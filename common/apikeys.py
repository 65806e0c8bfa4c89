"""Inference API keys: format, HMAC hashing, verification and rotation (their records: common.records.api_keys).

A key reads ``fvai_<prefix>_<secret>``. The prefix (12 hex chars) is an index, not a secret:
the gateway looks the record up by prefix, then compares HMAC-SHA256(server secret, whole key)
with ``hmac.compare_digest``. Only digests are stored. The HMAC secret comes from
FABRIC_KEY_HMAC_SECRET or the file named by FABRIC_KEY_HMAC_SECRET_FILE; a missing or empty
file is an error, never a fallback to something weaker.

Rotation keeps the prefix and issues a new secret; the old digest moves to ``previous_hash``
and stays valid until ``previous_valid_until`` (overlap), so clients can roll without downtime.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import InvalidInput, Unauthorized
from common.records import api_keys
from common.schemas import ApiKeyRecord
from common.store.base import Store

KEY_TAG = "fvai"
PREFIX_HEX = 12
SECRET_BYTES = 32
DEFAULT_OVERLAP_SECS = 3600


class HmacSecretError(ValueError):
    """The HMAC secret is not configured or unreadable (a start-up error)."""


NO_HMAC_SECRET = "set FABRIC_KEY_HMAC_SECRET or FABRIC_KEY_HMAC_SECRET_FILE"  # why keys are unavailable


def load_hmac_secret(env: Mapping[str, str]) -> bytes:
    """env: the process's environment as its settings read it at start (fabricd, the gateway)."""
    path = env.get("FABRIC_KEY_HMAC_SECRET_FILE", "").strip()
    if path:
        p = Path(path)
        if not p.is_file():
            raise HmacSecretError(f"FABRIC_KEY_HMAC_SECRET_FILE {path} does not exist")
        data = p.read_bytes().strip()
        if not data:
            raise HmacSecretError(f"FABRIC_KEY_HMAC_SECRET_FILE {path} is empty")
        return data
    value = env.get("FABRIC_KEY_HMAC_SECRET", "")
    if not value.strip():
        raise HmacSecretError(NO_HMAC_SECRET)
    return value.strip().encode()


def digest(hmac_secret: bytes, plaintext: str) -> str:
    """HMAC-SHA256 hex; the keyed state is made once per secret and copied (half the CPU of
    hmac.new on every call of the gateway's hot path)."""
    global _KEYED
    secret, keyed = _KEYED
    if secret is not hmac_secret:
        keyed = hmac.new(hmac_secret, digestmod=hashlib.sha256)
        _KEYED = (hmac_secret, keyed)
    h = keyed.copy()
    h.update(plaintext.encode())
    return h.hexdigest()


_KEYED: tuple[bytes | None, Any] = (None, None)  # (the secret, its keyed HMAC state)


def parse_key(plaintext: str) -> str:
    """Return the prefix of a well-formed key; Unauthorized otherwise (message names no secret)."""
    parts = plaintext.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_TAG or len(parts[1]) != PREFIX_HEX or not parts[2]:
        raise Unauthorized("the API key is malformed", code="invalid_api_key")
    return parts[1]


def looks_like_key(token: str) -> bool:
    return token.startswith(KEY_TAG + "_")


def new_plaintext(prefix: str | None = None) -> tuple[str, str]:
    prefix = prefix or secrets.token_hex(PREFIX_HEX // 2)
    return f"{KEY_TAG}_{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}", prefix


def secret_matches(record: ApiKeyRecord, plaintext: str, hmac_secret: bytes, now: float) -> bool:
    """Constant-time compare against the current digest, and the previous one during overlap."""
    d = digest(hmac_secret, plaintext)
    ok = hmac.compare_digest(d, record.hash)
    if record.previous_hash and record.previous_valid_until and now < record.previous_valid_until:
        # Both compares always run so timing does not say which secret matched.
        ok = hmac.compare_digest(d, record.previous_hash) or ok
    return ok


def is_expired(record: ApiKeyRecord, now: float) -> bool:
    return record.expires_at is not None and now >= record.expires_at


@dataclass(frozen=True)
class KeySpec:
    name: str
    endpoint: str
    model: str | None = None
    tenant: str | None = None
    ttl_secs: int = 0
    request_quota: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    priority: str | None = None
    fallbacks: tuple[str, ...] = ()
    shadow_limits: tuple[str, ...] = ()
    owner: str | None = None  # a playground key's user (controlplane.api.playground_keys)


PRIORITIES = ("low", "normal", "high")
# What a key's shadow_limits may name: its own limits by field, or a gateway-wide FABRIC_<LIMIT>.
SHADOWABLE = re.compile(r"^(request_quota|tokens_per_minute|max_concurrent|FABRIC_[A-Z][A-Z_]{0,62})$")


def build_record(spec: KeySpec, hmac_secret: bytes, now: float | None = None) -> tuple[ApiKeyRecord, str]:
    """A new record and its plaintext (shown to the operator once, never stored)."""
    now = time.time() if now is None else now
    if spec.ttl_secs < 0:
        raise InvalidInput("ttl_secs must be 0 (no expiry) or positive")
    for field in ("request_quota", "tokens_per_minute", "max_concurrent"):
        v = getattr(spec, field)
        if v is not None and v < 1:
            raise InvalidInput(f"{field} must be at least 1 when set")
    if spec.priority is not None and spec.priority not in PRIORITIES:
        raise InvalidInput("priority must be low, normal or high")
    for name in spec.shadow_limits:
        if not SHADOWABLE.match(name):
            raise InvalidInput("shadow_limits names request_quota, tokens_per_minute, max_concurrent or a "
                               f"FABRIC_<LIMIT> (FABRIC_TENANT_TPM...), not {name[:64]!r}")
    plaintext, prefix = new_plaintext()
    record = ApiKeyRecord(
        id=uuid.uuid4().hex[:16],
        name=spec.name,
        prefix=prefix,
        hash=digest(hmac_secret, plaintext),
        endpoint=spec.endpoint,
        model=spec.model,
        tenant=spec.tenant,
        ttl_secs=spec.ttl_secs,
        expires_at=(now + spec.ttl_secs) if spec.ttl_secs else None,
        request_quota=spec.request_quota,
        tokens_per_minute=spec.tokens_per_minute,
        max_concurrent=spec.max_concurrent,
        priority=spec.priority,
        fallbacks=list(spec.fallbacks),
        owner=spec.owner,
        shadow_limits=sorted(set(spec.shadow_limits)),
        created_at=now,
    )
    return record, plaintext


def rotated(record: ApiKeyRecord, hmac_secret: bytes, overlap_secs: int, now: float,
            renew: bool = False) -> tuple[ApiKeyRecord, str]:
    """A new secret; the current one keeps working for overlap_secs. ``renew`` (a key with a TTL):
    the new secret lives ttl_secs from now, and the current one exactly until it was due to expire,
    so a holder that renews before expiry never has a moment without a working secret."""
    if overlap_secs < 0:
        raise InvalidInput("overlap_secs must be 0 or positive")
    plaintext, _ = new_plaintext(record.prefix)
    update: dict = {
        "hash": digest(hmac_secret, plaintext),
        "previous_hash": record.hash if overlap_secs else None,
        "previous_valid_until": (now + overlap_secs) if overlap_secs else None,
    }
    if renew and record.ttl_secs:
        old_end = record.expires_at if record.expires_at is not None else now
        update.update(expires_at=now + record.ttl_secs, previous_hash=record.hash if old_end > now else None,
                      previous_valid_until=old_end if old_end > now else None)
    return record.model_copy(update=update), plaintext


# --- records in the store (common.records.api_keys) -------------------------------------------


def create_key(store: Store, spec: KeySpec, hmac_secret: bytes) -> tuple[ApiKeyRecord, str]:
    record, plaintext = build_record(spec, hmac_secret)
    api_keys.save_new(store, record)
    return record, plaintext


def rotate_key(
    store: Store, key_id: str, hmac_secret: bytes, overlap_secs: int = DEFAULT_OVERLAP_SECS, renew: bool = False
) -> tuple[ApiKeyRecord, str]:
    """A new secret for the key (its old one valid ``overlap_secs`` more); (record, plaintext)."""
    plaintext: list[str] = []

    def rotate(record: ApiKeyRecord) -> ApiKeyRecord:
        new, text = rotated(record, hmac_secret, overlap_secs, time.time(), renew)
        plaintext[:] = [text]
        return new

    return api_keys.update(store, key_id, rotate), plaintext[0]


def public_view(record: ApiKeyRecord) -> dict:
    """What the API may show: never a digest."""
    data = record.model_dump(exclude={"hash", "previous_hash"})
    data["rotating"] = bool(record.previous_hash and record.previous_valid_until)
    return data
