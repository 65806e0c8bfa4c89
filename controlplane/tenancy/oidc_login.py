"""OIDC login for the control plane: an identity provider's ID token in, a fabricd token out.

POST /api/auth/oidc {"id_token": ...} verifies the token against the configured provider and
answers what POST /api/auth/login does, with the role and tenant read from two claims:

  FABRIC_LOGIN_OIDC_ISSUER      the provider's issuer (the token's ``iss``, exactly)
  FABRIC_LOGIN_OIDC_JWKS_URL    its JSON Web Key Set
  FABRIC_LOGIN_OIDC_CLIENT_ID   fabricd's client id: the token's audience must be it; it may never
                                be ``fabric-inference`` (that audience is the gateway's)
  FABRIC_LOGIN_OIDC_ROLE_CLAIM (fabric_role), FABRIC_LOGIN_OIDC_TENANT_CLAIM (fabric_tenant)

The three first are set together or not at all (fabricd refuses to start otherwise; unset, the
route answers 404 "oidc_off"). A token without a role claim naming admin, operator or viewer is
refused (403 "no_role"): an identity the provider knows is not yet a Fabric user. Keys follow the
gateway's rules (common.jwks: asymmetric algorithms only, the key set kept for its Cache-Control
max-age, an unknown kid refetches at most once per cooldown). Neither token is ever logged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
import jwt

from common.errors import Forbidden, NotFound, Unauthorized
from common.jwks import ALGORITHMS, parse_key_set, ttl_of
from common.schemas import TENANT
from controlplane.tenancy.principal import ADMIN, ROLES, Principal

INFERENCE_AUDIENCE = "fabric-inference"
FETCH_TIMEOUT = 5.0
UNKNOWN_KID_COOLDOWN = 30.0
VARS = ("FABRIC_LOGIN_OIDC_ISSUER", "FABRIC_LOGIN_OIDC_JWKS_URL", "FABRIC_LOGIN_OIDC_CLIENT_ID")


@dataclass(frozen=True)
class OidcLoginSettings:
    issuer: str
    jwks_url: str
    client_id: str
    role_claim: str = "fabric_role"
    tenant_claim: str = "fabric_tenant"


def settings_from_env(env: Mapping[str, str]) -> OidcLoginSettings | None:
    """None when OIDC login is off; ValueError naming the variable when it is half set."""
    values = [env.get(name, "").strip() for name in VARS]
    if not any(values):
        return None
    if not all(values):
        missing = [n for n, v in zip(VARS, values) if not v]
        raise ValueError(f"OIDC login needs all of {', '.join(VARS)}; missing {', '.join(missing)}")
    if values[2] == INFERENCE_AUDIENCE:
        raise ValueError(f"FABRIC_LOGIN_OIDC_CLIENT_ID may not be {INFERENCE_AUDIENCE!r}: that audience is "
                         "the inference gateway's, and a token for it must never sign in to the control plane")
    return OidcLoginSettings(*values, role_claim=env.get("FABRIC_LOGIN_OIDC_ROLE_CLAIM", "").strip() or "fabric_role",
                             tenant_claim=env.get("FABRIC_LOGIN_OIDC_TENANT_CLAIM", "").strip() or "fabric_tenant")


def principal_of(claims: dict, settings: OidcLoginSettings) -> Principal:
    """Pure: the Fabric caller a verified token's claims name."""
    role = claims.get(settings.role_claim)
    if role not in ROLES:
        raise Forbidden(f"the ID token's {settings.role_claim!r} claim names no Fabric role "
                        f"({', '.join(ROLES)})", code="no_role")
    tenant = claims.get(settings.tenant_claim)
    if tenant is not None and (not isinstance(tenant, str) or not TENANT.match(tenant)):
        raise Forbidden(f"the ID token's {settings.tenant_claim!r} claim is not a tenant name", code="bad_tenant")
    return Principal(f"oidc:{claims['sub']}", role, None if role == ADMIN else tenant)


@dataclass
class OidcLogin:
    """The verifier fabricd keeps for the process (sync: a login is one request, not a stream)."""

    settings: OidcLoginSettings
    _keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    _expires: float = 0.0
    _last_fetch: float = -1e9
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _fetch(self) -> None:
        self._last_fetch = time.monotonic()
        r = httpx.get(self.settings.jwks_url, timeout=FETCH_TIMEOUT)
        r.raise_for_status()
        self._keys = parse_key_set(r.json())
        self._expires = time.monotonic() + ttl_of(r.headers.get("cache-control"))

    def key(self, kid: str) -> jwt.PyJWK | None:
        with self._lock:
            now = time.monotonic()
            stale = now >= self._expires
            unknown = kid not in self._keys and now - self._last_fetch >= UNKNOWN_KID_COOLDOWN
            if stale or unknown:
                try:
                    self._fetch()
                except (httpx.HTTPError, ValueError):
                    if time.monotonic() >= self._expires:
                        return None  # no fresh key set: fail closed
            return self._keys.get(kid)

    def verify(self, id_token: str) -> Principal:
        try:
            kid = jwt.get_unverified_header(id_token).get("kid")
        except jwt.PyJWTError:
            raise Unauthorized("the ID token is not a JWT", code="invalid_token") from None
        key = self.key(str(kid) if kid is not None else "")
        if key is None:
            raise Unauthorized("the ID token's signing key is not in the provider's current key set",
                               code="invalid_token")
        try:
            claims = jwt.decode(id_token, key.key, algorithms=ALGORITHMS, audience=self.settings.client_id,
                                issuer=self.settings.issuer, options={"require": ["exp", "iss", "sub", "aud"]})
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the ID token has expired", code="token_expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized("the ID token is not for this fabricd's client id", code="invalid_audience") from None
        except jwt.PyJWTError:
            raise Unauthorized("the ID token did not verify", code="invalid_token") from None
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if INFERENCE_AUDIENCE in audiences:  # also for the gateway: never a control-plane login
            raise Unauthorized(f"an ID token for {INFERENCE_AUDIENCE} never signs in to the control plane",
                               code="invalid_audience")
        return principal_of(claims, self.settings)


def login_of(app_state, settings) -> OidcLogin:
    """The process's OidcLogin (made on first use, kept on the app state); 404 when OIDC is off.
    settings: fabricd's FABRIC_LOGIN_OIDC_* as its settings read them at start (None: off)."""
    login = getattr(app_state, "oidc_login", None)
    if login is None:
        if settings is None:
            raise NotFound("OIDC login is not configured on this fabricd (FABRIC_LOGIN_OIDC_ISSUER, "
                           "FABRIC_LOGIN_OIDC_JWKS_URL, FABRIC_LOGIN_OIDC_CLIENT_ID)", code="oidc_off")
        login = app_state.oidc_login = OidcLogin(settings)
    return login
