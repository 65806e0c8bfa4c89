"""Per-tenant caps the gateway applies beside its own settings (common.tenant_limits): today a
tenant's ``max_context_tokens``, the tighter of it and FABRIC_MAX_CONTEXT applying.

Every tenant's limits are one cached read (gateway.refresh_cache: one store list per TTL for all
callers together), so a call never waits for the store while the cache is fresh.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.records import tenant_limits
from common.store.base import Store
from common.tenant_limits import TenantLimits
from gateway.refresh_cache import RefreshCache


def read_limits(store: Store) -> dict[str, TenantLimits]:
    """Every tenant's limits; an unreadable record is skipped and counted (the gateway-wide limits apply)."""
    return {limits.tenant: limits for limits in tenant_limits.list(store)}


def tighter(gateway_wide: int, tenant: int | None) -> int:
    """Pure: the context limit that applies."""
    return gateway_wide if tenant is None else min(gateway_wide, tenant)


@dataclass
class TenantCaps:
    store: Store
    ttl_secs: float = 1.0

    def __post_init__(self) -> None:
        self._cache: RefreshCache[dict[str, TenantLimits]] = RefreshCache(self.ttl_secs, 1)

    async def max_context(self, tenant: str | None) -> int | None:
        """The tenant's max_context_tokens (None: it has none, or the call has no tenant)."""
        if tenant is None:
            return None
        limits = (await self._cache.get("limits", lambda: read_limits(self.store))).get(tenant)
        return limits.max_context_tokens if limits is not None else None
