"""Tenant limit records (/fabric/tenant-limits/<tenant>, common.tenant_limits): typed reads and
validated writes; the gateway reads the same records through gateway.tenant_caps."""

from __future__ import annotations

import builtins

from common import keyspace
from common.errors import NotFound
from common.records import reading
from common.store.base import Store
from common.tenant_limits import TenantLimits

KIND = "tenant limits"


def get(store: Store, tenant: str) -> TenantLimits | None:
    kv = store.get(keyspace.tenant_limits(tenant))
    return None if kv is None else reading.one(TenantLimits, kv, KIND)


def list(store: Store) -> builtins.list[TenantLimits]:  # noqa: A001 - the module's verb
    out = reading.each(TenantLimits, store.list(keyspace.tenant_limits()), KIND)
    return sorted(out, key=lambda t: t.tenant)


def put(store: Store, limits: TenantLimits) -> TenantLimits:
    """Create or replace the tenant's limits (one document)."""
    limits = TenantLimits.model_validate({**limits.model_dump(), "updated_at": limits.updated_at},
                                         context={"stored": True})
    store.put(keyspace.tenant_limits(limits.tenant), limits.model_dump_json())
    return limits


def delete(store: Store, tenant: str) -> None:
    if not store.delete(keyspace.tenant_limits(tenant)):
        raise NotFound(f"tenant {tenant!r} has no limits set")
