"""Who is calling: an API key (prefix lookup, constant-time HMAC compare, scope checks) or an
OIDC JWT. The result is an Identity; every refusal is Unauthorized (401) or Forbidden (403).

Key records are cached per prefix for a short TTL so the hot path does no store round trip;
the store stays the source of truth (a deleted or rotated key takes effect within the TTL).
The control plane's admin token (a JWT with audience fabric-admin) is never accepted: it is not
an API key, and as a JWT its issuer is not an inference OIDC provider.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from common import apikeys
from common.errors import Forbidden, Unauthorized
from common.schemas import ApiKeyRecord
from common.store.base import Store
from gateway.oidc import OidcVerifier, looks_like_jwt

CACHE_MAX = 10_000


@dataclass(frozen=True)
class Identity:
    kind: str  # "key" or "oidc"
    subject: str  # key id, or the JWT's sub
    tenant: str | None
    record: ApiKeyRecord | None = None


def bearer_token(headers: dict[str, str]) -> str:
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    alt = headers.get("api-key") or headers.get("x-api-key")
    if alt:
        return alt.strip()
    raise Unauthorized("missing API key: send Authorization: Bearer fvai_...", code="missing_api_key")


def check_scope(record: ApiKeyRecord, endpoint: str, model: str | None, now: float, subpath: str = "") -> None:
    """Pure: raise if this valid key may not call this endpoint/model now.

    A model-scoped key may list models (no body names a model there), but not use files or
    batches: their lines name models inside an uploaded file the gateway does not read."""
    if apikeys.is_expired(record, now):
        raise Unauthorized("the API key has expired", code="expired_api_key")
    if record.endpoint != endpoint:
        raise Forbidden(f"the API key is not scoped to endpoint {endpoint!r}", code="endpoint_not_allowed")
    if record.model and model != record.model:
        if model is None and subpath.rstrip("/") == "/v1/models":
            return
        if model is None and subpath.startswith(("/v1/files", "/v1/batches")):
            raise Forbidden(f"the API key only allows model {record.model!r}, and files and batches can name any "
                            "model; use a key without a model scope for them", code="model_not_allowed")
        raise Forbidden(f"the API key only allows model {record.model!r}", code="model_not_allowed")


@dataclass
class Authenticator:
    store: Store
    hmac_secret: bytes
    oidc: OidcVerifier
    ttl_secs: float = 1.0
    _cache: dict[str, tuple[float, ApiKeyRecord | None]] = field(default_factory=dict)

    async def _record(self, prefix: str) -> ApiKeyRecord | None:
        now = time.monotonic()
        hit = self._cache.get(prefix)
        if hit is not None and hit[0] > now:
            return hit[1]
        record = await asyncio.to_thread(apikeys.find_by_prefix, self.store, prefix)
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()  # crude bound: a flood of random prefixes cannot grow memory
        self._cache[prefix] = (now + self.ttl_secs, record)
        return record

    async def authenticate(self, headers: dict[str, str], endpoint: str, model: str | None,
                           subpath: str = "") -> Identity:
        token = bearer_token(headers)
        if apikeys.looks_like_key(token):
            prefix = apikeys.parse_key(token)
            record = await self._record(prefix)
            now = time.time()
            if record is None or not apikeys.secret_matches(record, token, self.hmac_secret, now):
                raise Unauthorized("the API key is not valid", code="invalid_api_key")
            check_scope(record, endpoint, model, now, subpath)
            return Identity("key", record.id, record.tenant, record)
        if looks_like_jwt(token) and self.oidc.providers:
            claims = await asyncio.to_thread(self.oidc.verify, token)
            return Identity("oidc", claims.subject, claims.tenant)
        raise Unauthorized("the bearer token is not a Fabric API key or an accepted OIDC token", code="invalid_api_key")
