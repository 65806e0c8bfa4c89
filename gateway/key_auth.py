"""Who is calling: an API key (prefix lookup, constant-time HMAC compare, scope checks) or an
OIDC JWT. The result is an Identity; every refusal is Unauthorized (401) or Forbidden (403).

Key records are cached per prefix for a short TTL so the hot path does no store round trip;
the store stays the source of truth (a deleted or rotated key takes effect within the TTL;
gateway.refresh_cache reloads a record in use ahead of its expiry, so no call waits for it).
A key that matched its record's current digest is remembered against that record object (the
HMAC was ~3% of a proxied call's CPU): the next call presenting it skips the HMAC while the
cache serves the same record; a reloaded, rotated or deleted record is a new object (or none),
so the key is checked again. A match of the previous digest during a rotation's overlap is not
remembered (it ends with time), and a key that fails is never remembered.
The control plane's admin token (a JWT with audience fabric-admin) is never accepted: it is not
an API key, and as a JWT its issuer is not an inference OIDC provider.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common import apikeys
from common.errors import Forbidden, Unauthorized
from common.records import api_keys
from common.schemas import ApiKeyRecord
from common.store.base import Store
from gateway.oidc import OidcVerifier, looks_like_jwt
from gateway.oidc_access import OidcAccess, check_endpoint, decide
from gateway.refresh_cache import RefreshCache

CACHE_MAX = 10_000
VERIFIED_MAX = 4096  # keys remembered as matching their record (cleared when full)


@dataclass(frozen=True)
class Identity:
    kind: str  # "key" or "oidc"
    subject: str  # key id, or the JWT's sub
    tenant: str | None
    record: ApiKeyRecord | None = None
    endpoints: tuple[str, ...] | None = None  # OIDC: the endpoints it may call ("*": all; gateway.oidc_access)

    def may_call(self, endpoint: str) -> bool:
        """Pure: whether this caller may reach the endpoint (the rule identify applies)."""
        if self.record is not None:
            return self.record.endpoint == endpoint
        return self.endpoints is not None and ("*" in self.endpoints or endpoint in self.endpoints)

    def may_leave(self, fallback: str) -> bool:
        """Pure: whether this caller's prompts may go to an external fallback endpoint: a key that
        names it in ``fallbacks`` (or is its own endpoint), an OIDC token whose claim names it."""
        if self.record is not None:
            return fallback in self.record.fallbacks or self.record.endpoint == fallback
        return self.may_call(fallback)


def bearer_token(headers: dict[str, str]) -> str:
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    alt = headers.get("api-key") or headers.get("x-api-key")
    if alt:
        return alt.strip()
    raise Unauthorized("missing API key: send Authorization: Bearer fvai_...", code="missing_api_key")


def check_key(record: ApiKeyRecord, endpoint: str, now: float) -> None:
    """Pure: raise if this valid key may not call this endpoint now (headers only: no body read)."""
    if apikeys.is_expired(record, now):
        raise Unauthorized("the API key has expired", code="expired_api_key")
    if record.endpoint != endpoint:
        raise Forbidden(f"the API key is not scoped to endpoint {endpoint!r}", code="endpoint_not_allowed")


# Listings show every model's files and batches; a model-scoped key may not read them.
LISTINGS = ("/v1/files", "/v1/batches")


def check_model(identity: Identity, model: str | None, path: str, method: str) -> None:
    """Pure: raise if the key's model scope forbids this operation. Checked on the operation, not
    on what the body claims: listings that reveal other models' files are refused; uploading a
    file and reading one by id are allowed; creating a batch is checked on the models inside its
    input file (gateway.batch_scope) by the caller; every other call must name the key's model."""
    scoped = identity.record.model if identity.record else None
    if not scoped:
        return
    p = path.rstrip("/")
    if p == "/v1/models" and model is None:
        return
    if method == "GET" and p in LISTINGS:
        raise Forbidden(f"the API key only allows model {scoped!r}; listing {p} would show other models' "
                        "files and batches", code="model_not_allowed")
    if p.startswith(("/v1/files/", "/v1/batches/")):
        return  # one file or batch by its (unguessable) id
    if p in LISTINGS and method == "POST":
        return  # an upload runs nothing; a batch is checked on the models in its input file
    if model != scoped:
        raise Forbidden(f"the API key only allows model {scoped!r}", code="model_not_allowed")


@dataclass
class Authenticator:
    store: Store
    hmac_secret: bytes
    oidc: OidcVerifier
    ttl_secs: float = 1.0
    access: OidcAccess | None = None  # what an OIDC token may call (gateway.oidc_access); None: its claim only

    def __post_init__(self) -> None:
        # gateway.refresh_cache: one store read per prefix per TTL, never on a call's path
        self._cache: RefreshCache[ApiKeyRecord | None] = RefreshCache(self.ttl_secs, CACHE_MAX)
        self._verified: dict[str, ApiKeyRecord] = {}  # key -> the record object it matched

    def _matches(self, record: ApiKeyRecord, token: str, now: float) -> bool:
        """apikeys.secret_matches, remembered for this record object when the current digest
        matched (no previous digest in its overlap window)."""
        if self._verified.get(token) is record:
            return True
        if not apikeys.secret_matches(record, token, self.hmac_secret, now):
            return False
        if not (record.previous_hash and record.previous_valid_until and now < record.previous_valid_until):
            if len(self._verified) >= VERIFIED_MAX:
                self._verified.clear()
            self._verified[token] = record
        return True

    async def _record(self, prefix: str) -> ApiKeyRecord | None:
        return await self._cache.get(prefix, lambda: api_keys.find_by_prefix(self.store, prefix))

    async def identify(self, headers: dict[str, str], endpoint: str | None) -> Identity:
        """Who is calling, from the headers alone (run before any body byte is read). endpoint
        None (the root /v1, routed by the body's model): the credential is checked, the endpoint
        later with Identity.may_call."""
        token = bearer_token(headers)
        if apikeys.looks_like_key(token):
            prefix = apikeys.parse_key(token)
            record = await self._record(prefix)
            now = time.time()
            if record is None or not self._matches(record, token, now):
                raise Unauthorized("the API key is not valid", code="invalid_api_key")
            if endpoint is None:
                if apikeys.is_expired(record, now):
                    raise Unauthorized("the API key has expired", code="expired_api_key")
            else:
                check_key(record, endpoint, now)
            return Identity("key", record.id, record.tenant, record)
        if looks_like_jwt(token) and self.oidc.providers:
            claims = await self.oidc.verify(token)
            grant = await self.access.grant(claims) if self.access is not None else decide(claims, (), {}, False)
            if endpoint is not None:
                check_endpoint(grant, endpoint, self.oidc.endpoints_claim)
            return Identity("oidc", claims.subject, grant.tenant, endpoints=tuple(sorted(grant.endpoints)))
        raise Unauthorized("the bearer token is not a Fabric API key or an accepted OIDC token", code="invalid_api_key")


def presented_id(headers: dict[str, str]) -> str | None:
    """A non-secret name for the credential a refused caller presented, for the audit row: the
    key's prefix (an index, not a secret) or "jwt"; never the token itself."""
    try:
        token = bearer_token(headers)
    except Unauthorized:
        return None
    if apikeys.looks_like_key(token):
        try:
            return "prefix:" + apikeys.parse_key(token)
        except Unauthorized:
            return "malformed-key"
    return "jwt" if looks_like_jwt(token) else "unknown-token"
