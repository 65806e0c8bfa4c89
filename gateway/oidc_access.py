"""What a verified inference OIDC token may call, and as which tenant (gateway.oidc verifies it).

Identity providers emit groups and roles, rarely a list of our endpoints, so a token's access is
the union of three sources:
1. the FABRIC_OIDC_ENDPOINTS_CLAIM claim (default ``fabric_endpoints``), when the token has one
   and its issuer may assert it (gateway.oidc);
2. the identity mappings its claims match (common.identity_mappings, stored in fabricd and
   managed with ``fabricctl ai identity-mapping``): e.g. Keycloak's ``groups`` holding
   ``/ml-team`` or ``realm_access.roles`` holding ``ml-user``, Entra ID's ``roles`` or ``groups``
   holding a GUID;
3. the endpoints its tenant owns (an endpoint's ``tenant``), unless FABRIC_OIDC_TENANT_ENDPOINTS=0:
   issuer and audience suffice for a tenant's own endpoints.

The tenant is the token's ``tenant`` claim (when its issuer may assert it), else the ``tenant``
of the first matched mapping (by name) that sets one, else none: ``sub`` is never taken for a
tenant name, so a user whose subject happens to equal a tenant's name owns nothing. ``decide`` is pure; OidcAccess reads the mappings and the
endpoints' owners from the store through gateway.refresh_cache (one read per TTL for every
caller together, never on a call's path while fresh).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from common.errors import Forbidden
from common.identity_mappings import IdentityMapping, matching
from common.records import endpoints as endpoint_records
from common.records import identity_mappings
from common.store.base import Store
from gateway.oidc import OidcClaims
from gateway.refresh_cache import RefreshCache


@dataclass(frozen=True)
class Grant:
    tenant: str | None
    endpoints: frozenset[str]  # "*": every endpoint
    mappings: tuple[str, ...] = ()  # the matched mappings' names


def decide(claims: OidcClaims, mappings: Iterable[IdentityMapping], owners: Mapping[str, str | None],
           by_ownership: bool = True) -> Grant:
    """Pure: the tenant and endpoints of a verified token."""
    matched = matching(mappings, claims.claims, claims.issuer)
    tenant = claims.tenant or next((m.tenant for m in matched if m.tenant), None)
    endpoints = set(claims.endpoints or ())
    for m in matched:
        endpoints.update(m.endpoints)
    if by_ownership and tenant is not None:
        endpoints.update(e for e, owner in owners.items() if owner is not None and owner == tenant)
    return Grant(tenant, frozenset(endpoints), tuple(m.name for m in matched))


def check_endpoint(grant: Grant, endpoint: str, claim: str) -> None:
    """Pure: 403 endpoint_not_allowed unless the grant covers the endpoint."""
    if "*" in grant.endpoints or endpoint in grant.endpoints:
        return
    raise Forbidden(f"this token may not call endpoint {endpoint!r}: neither its {claim!r} claim, nor an "
                    "identity mapping its groups or roles match, nor its tenant's ownership names it",
                    code="endpoint_not_allowed")


def read_mappings(store: Store) -> tuple[IdentityMapping, ...]:
    """Every mapping, by name; an unreadable one is skipped and counted (it grants nothing)."""
    return tuple(identity_mappings.list(store))


def read_owners(store: Store) -> dict[str, str | None]:
    return {e.name: e.tenant for e in endpoint_records.list(store)}


@dataclass
class OidcAccess:
    store: Store
    ttl_secs: float = 1.0
    by_ownership: bool = True

    def __post_init__(self) -> None:
        self._mappings: RefreshCache[tuple[IdentityMapping, ...]] = RefreshCache(self.ttl_secs, 1)
        self._owners: RefreshCache[dict[str, str | None]] = RefreshCache(self.ttl_secs, 1)

    async def grant(self, claims: OidcClaims) -> Grant:
        mappings = await self._mappings.get("mappings", lambda: read_mappings(self.store))
        owners = await self._owners.get("owners", lambda: read_owners(self.store)) if self.by_ownership else {}
        return decide(claims, mappings, owners, self.by_ownership)
