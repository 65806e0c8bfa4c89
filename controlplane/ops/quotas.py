"""Quota operations: set (create or replace) a tenant's quota (GPUs, CPU, memory, guaranteed GPUs).

Lowering a quota below what the tenant already holds is allowed: nothing is taken away, only
growth (create, scale up, autoscaler scale-out) is refused until use is back under it.
"""

from __future__ import annotations

import time

from common.records import quotas as quota_records
from common.schemas import TenantQuota
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


def set_quota(ctx: AppState, caller: Principal | None, body: TenantQuota) -> TenantQuota:
    quota = quota_records.put(ctx.store, body.model_copy(update={"updated_at": time.time()}))
    limits = ", ".join(f"{field} {getattr(quota, field):g}" for field in
                       ("max_gpus", "max_cpu", "max_memory_gib", "guaranteed_gpus") if getattr(quota, field) is not None)
    common.event(ctx, "tenant", quota.tenant, "QuotaSet", f"tenant {quota.tenant} {limits}", tenant=quota.tenant)
    return quota


def update(ctx: AppState, caller: Principal | None, name: str, changes: dict) -> TenantQuota:
    """Apply's in-place change of a quota: the stored quota with ``changes`` laid over it, the same
    write and event as set_quota."""
    current = quota_records.get(ctx.store, name)
    kept = current.model_dump(exclude={"updated_at"}) if current is not None else {"tenant": name}
    return set_quota(ctx, caller, TenantQuota.model_validate({**kept, **changes}))
