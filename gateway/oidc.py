"""OIDC JWT verification for inference callers.

A token is accepted when its issuer is a configured provider, its signature checks against a
key of that provider's JWKS, and its audience is exactly ``fabric-inference`` -- any other
audience (the control plane's ``fabric-admin`` tokens included) is refused unless
FABRIC_GATEWAY_ACCEPT_JWT=1. What a verified token may call is gateway.oidc_access's decision.

An issuer asserts only the claims its configuration lists (OidcProvider.claims, none unless
configured): ``tenant`` (the token's ``tenant`` claim names its tenant) and ``endpoints`` (the
FABRIC_OIDC_ENDPOINTS_CLAIM claim, default ``fabric_endpoints``: a list, or a space-separated
string; ``*`` for all). Any other issuer's ``tenant`` or endpoints claim is ignored: an identity
provider that lets users edit their own attributes cannot make them another tenant. ``sub``
never names a tenant.

The key set is cached per provider for the TTL its Cache-Control max-age gives (default 5 min,
bounded 10 s .. 1 day), so a withdrawn key stops verifying within that TTL; a set past its TTL
is never used (fail closed). Fetches are async (httpx on the event loop, single-flight per
provider): nothing blocks the thread pool that store calls share. A set nearing expiry is
refreshed in the background while the old one still serves; an unknown ``kid`` triggers at most
one refresh per cooldown (UNKNOWN_KID_COOLDOWN), so random kids cannot make the gateway hammer
the identity provider.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx
import jwt

from common.errors import Unauthorized
from common.jwks import ALGORITHMS, MIN_TTL, parse_key_set, ttl_of
from gateway.settings import OidcProvider

INFERENCE_AUDIENCE = "fabric-inference"
REFRESH_AHEAD = 0.8  # refresh in the background once 80% of the TTL has passed
UNKNOWN_KID_COOLDOWN = 30.0
FETCH_TIMEOUT = 5.0


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2


@dataclass(frozen=True)
class OidcClaims:
    subject: str
    tenant: str | None  # the tenant claim, when the issuer may assert it (module docstring)
    issuer: str
    endpoints: frozenset[str] | None = None  # None: the token names no endpoints
    claims: dict = field(default_factory=dict, compare=False)  # every verified claim (gateway.oidc_access)


def endpoints_of(claims: dict, claim: str) -> frozenset[str] | None:
    value = claims.get(claim)
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    return frozenset()


@dataclass
class KeySet:
    keys: dict[str, jwt.PyJWK]
    fetched_at: float
    ttl: float

    def fresh(self, now: float) -> bool:
        return now < self.fetched_at + self.ttl


@dataclass
class JwksCache:
    """Per-provider key sets; every fetch is async and single-flight."""

    min_ttl: float = MIN_TTL
    _sets: dict[str, KeySet] = field(default_factory=dict)
    _inflight: dict[str, asyncio.Task] = field(default_factory=dict)
    _last_fetch: dict[str, float] = field(default_factory=dict)
    _http: httpx.AsyncClient | None = None
    fetches: int = 0

    async def _fetch(self, provider: OidcProvider) -> KeySet:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=FETCH_TIMEOUT)
        self.fetches += 1
        self._last_fetch[provider.issuer] = time.monotonic()
        r = await self._http.get(provider.jwks_url)
        r.raise_for_status()
        keys = parse_key_set(json.loads(r.content))
        ks = KeySet(keys, time.monotonic(), max(self.min_ttl, ttl_of(r.headers.get("cache-control"))))
        self._sets[provider.issuer] = ks
        return ks

    def _refresh(self, provider: OidcProvider) -> asyncio.Task:
        task = self._inflight.get(provider.issuer)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._fetch(provider))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "never retrieved"
            self._inflight[provider.issuer] = task
        return task

    async def key(self, provider: OidcProvider, kid: str) -> jwt.PyJWK | None:
        now = time.monotonic()
        ks = self._sets.get(provider.issuer)
        stale = ks is None or not ks.fresh(now)
        unknown = ks is not None and kid not in ks.keys
        cooled = now - self._last_fetch.get(provider.issuer, -1e9) >= UNKNOWN_KID_COOLDOWN
        if stale or (unknown and cooled):
            try:
                ks = await asyncio.wait_for(asyncio.shield(self._refresh(provider)), FETCH_TIMEOUT + 1)
            except Exception:  # noqa: BLE001 - the provider is down: fail closed below
                ks = self._sets.get(provider.issuer)
                if ks is None or not ks.fresh(time.monotonic()):
                    return None
        elif now > ks.fetched_at + ks.ttl * REFRESH_AHEAD:
            self._refresh(provider)  # in the background; this call uses the still-fresh set
        return ks.keys.get(kid) if ks is not None else None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()


@dataclass
class OidcVerifier:
    providers: tuple[OidcProvider, ...]
    accept_any_audience: bool = False
    endpoints_claim: str = "fabric_endpoints"
    jwks: JwksCache = field(default_factory=JwksCache)

    async def verify(self, token: str) -> OidcClaims:
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Unauthorized("the bearer token is neither an API key nor a valid JWT", code="invalid_token") from None
        issuer = unverified.get("iss")
        provider = next((p for p in self.providers if p.issuer == issuer), None)
        if provider is None:
            raise Unauthorized("the JWT's issuer is not a configured OIDC provider", code="invalid_token")
        kid = header.get("kid")
        key = await self.jwks.key(provider, str(kid) if kid is not None else "")
        if key is None:
            raise Unauthorized("the JWT's signing key is not in the provider's current key set", code="invalid_token")
        try:
            options = {"require": ["exp", "iss", "sub"], "verify_aud": not self.accept_any_audience}
            claims = jwt.decode(
                token, key.key, algorithms=ALGORITHMS, issuer=provider.issuer,
                audience=INFERENCE_AUDIENCE if not self.accept_any_audience else None, options=options,
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the JWT has expired", code="token_expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized(f"the JWT's audience is not {INFERENCE_AUDIENCE}", code="invalid_audience") from None
        except jwt.PyJWTError:
            raise Unauthorized("the JWT did not verify", code="invalid_token") from None
        tenant = claims.get("tenant") if "tenant" in provider.claims else None
        return OidcClaims(subject=str(claims["sub"]), tenant=tenant if isinstance(tenant, str) and tenant else None,
                          issuer=provider.issuer, claims=claims,
                          endpoints=endpoints_of(claims, self.endpoints_claim) if "endpoints" in provider.claims
                          else None)
