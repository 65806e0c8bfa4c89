"""Quota operations: set (create or replace) a tenant's GPU quota.

Lowering a quota below what the tenant already holds is allowed: nothing is taken away, only
growth (create, scale up, autoscaler scale-out) is refused until use is back under it.
"""

from __future__ import annotations

import time

from common.schemas import TenantQuota
from controlplane.ops import common
from controlplane.records import quotas as quota_records
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


def set_quota(ctx: AppState, caller: Principal | None, body: TenantQuota) -> TenantQuota:
    quota = quota_records.put(ctx.store, body.model_copy(update={"updated_at": time.time()}))
    common.event(ctx, "tenant", quota.tenant, "QuotaSet", f"tenant {quota.tenant} max_gpus {quota.max_gpus}",
                 tenant=quota.tenant)
    return quota


def update(ctx: AppState, caller: Principal | None, name: str, changes: dict) -> TenantQuota:
    """Apply's in-place change of a quota: the same write and event as set_quota."""
    return set_quota(ctx, caller, TenantQuota(tenant=name, **changes))
