"""OIDC JWT verification for inference callers.

A token is accepted when its issuer is a configured provider, its signature checks against that
provider's JWKS (PyJWT's PyJWKClient fetches and caches the key set), and its audience is exactly
``fabric-inference`` -- any other audience (the control plane's ``fabric-admin`` tokens included)
is refused unless FABRIC_GATEWAY_ACCEPT_JWT=1. The tenant is the ``tenant`` claim, else ``sub``.
Verification does blocking HTTP on a JWKS miss, so callers run it in a thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jwt

from common.errors import Unauthorized
from gateway.settings import OidcProvider

INFERENCE_AUDIENCE = "fabric-inference"
ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2


@dataclass(frozen=True)
class OidcClaims:
    subject: str
    tenant: str
    issuer: str


@dataclass
class OidcVerifier:
    providers: tuple[OidcProvider, ...]
    accept_any_audience: bool = False
    _clients: dict[str, jwt.PyJWKClient] = field(default_factory=dict)

    def _client(self, provider: OidcProvider) -> jwt.PyJWKClient:
        client = self._clients.get(provider.issuer)
        if client is None:
            client = jwt.PyJWKClient(provider.jwks_url, cache_keys=True, lifespan=300, timeout=5)
            self._clients[provider.issuer] = client
        return client

    def verify(self, token: str) -> OidcClaims:
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Unauthorized("the bearer token is neither an API key nor a valid JWT", code="invalid_token") from None
        issuer = unverified.get("iss")
        provider = next((p for p in self.providers if p.issuer == issuer), None)
        if provider is None:
            raise Unauthorized("the JWT's issuer is not a configured OIDC provider", code="invalid_token")
        try:
            key = self._client(provider).get_signing_key_from_jwt(token)
            options = {"require": ["exp", "iss", "sub"], "verify_aud": not self.accept_any_audience}
            claims = jwt.decode(
                token, key.key, algorithms=ALGORITHMS, issuer=provider.issuer,
                audience=INFERENCE_AUDIENCE if not self.accept_any_audience else None, options=options,
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the JWT has expired", code="token_expired") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized(f"the JWT's audience is not {INFERENCE_AUDIENCE}", code="invalid_audience") from None
        except (jwt.PyJWTError, jwt.PyJWKClientError):
            raise Unauthorized("the JWT did not verify", code="invalid_token") from None
        subject = str(claims["sub"])
        return OidcClaims(subject=subject, tenant=str(claims.get("tenant") or subject), issuer=provider.issuer)
