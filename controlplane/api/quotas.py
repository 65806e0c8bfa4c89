"""Tenant GPU quotas (the check: controlplane.tenancy.quotas; the write: controlplane.ops.quotas).

  POST /api/ai/quotas   {"tenant": "acme", "max_gpus": 8, "max_cpu": 64, "max_memory_gib": 256,
                         "guaranteed_gpus": 2}               set (create or replace) a tenant's quota
  GET  /api/ai/quotas                                        every quota with its use and the room left

Lowering a quota below what the tenant already holds is allowed: nothing is taken away, only
growth (create, scale up, autoscaler scale-out) is refused until use is back under it.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from common.records import deployments
from common.schemas import TenantQuota
from controlplane.api.answers import QuotaUse
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import quotas as quota_ops
from controlplane.state import StateDep
from controlplane.tenancy import quotas

router = APIRouter(prefix="/api/ai", tags=["quotas"], dependencies=[Depends(require_admin)])


def with_use(quota: TenantQuota, used: quotas.Amount) -> dict:
    return {**quota.model_dump(mode="json"), "used_gpus": used.gpus, "used_cpu": used.cpu,
            "used_memory_gib": used.memory_gib, "room": quotas.room(quota, used)}


def _with_use(state, quota: TenantQuota) -> dict:
    return with_use(quota, quotas.tenant_usage(state.store, quota.tenant))


@router.post("/quotas", response_model=QuotaUse)
def set_quota(body: TenantQuota, state: StateDep, who: PrincipalDep) -> dict:
    return _with_use(state, quota_ops.set_quota(state, who, body))


@router.get("/quotas", response_model=list[QuotaUse])
def list_quotas(state: StateDep) -> list[dict]:
    amounts = quotas.per_replica(state.store)
    records = [dep for _, dep in deployments.stored_items(state.store)]
    surges = quotas.rollout_surges(state.store, amounts)
    return [with_use(q, quotas.usage(records, q.tenant, amounts, surges=surges))
            for _, q in sorted(quotas.load_all(state.store).items())]
