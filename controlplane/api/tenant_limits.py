"""A tenant's inference limits at the gateway (common.tenant_limits).

    POST   /api/ai/tenant-limits            {"tenant": "acme", "max_context_tokens": 8192}: set (create or replace; admin)
    GET    /api/ai/tenant-limits            every tenant's; a tenant-bound caller sees its own
    DELETE /api/ai/tenant-limits/{tenant}   back to the gateway-wide limits (admin)

The gateway applies a change within its cache TTL (FABRIC_GATEWAY_CACHE_SECS).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from common.tenant_limits import TenantLimits
from controlplane.api.answers import TenantDeleted
from controlplane.auth import PrincipalDep, require_admin
from controlplane.events import record_event
from controlplane.records import tenant_limits
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["tenancy"], dependencies=[Depends(require_admin)])


@router.post("/tenant-limits", status_code=201, response_model=TenantLimits)
def put_limits(body: TenantLimits, state: StateDep) -> dict:
    limits = tenant_limits.put(state.store, body.model_copy(update={"updated_at": time.time()}))
    record_event(state.store, "tenant", limits.tenant, "LimitsSet",
                 f"tenant {limits.tenant} max_context_tokens {limits.max_context_tokens or '-'}",
                 tenant=limits.tenant, keep=state.settings.events_kept, max_age_s=state.settings.events_max_age_s)
    return limits.model_dump(mode="json")


@router.get("/tenant-limits", response_model=list[TenantLimits])
def list_limits(state: StateDep, who: PrincipalDep) -> list[dict]:
    return [t.model_dump(mode="json") for t in tenant_limits.list(state.store)
            if not who.bound or t.tenant == who.tenant]


@router.delete("/tenant-limits/{tenant}", response_model=TenantDeleted)
def delete_limits(tenant: str, state: StateDep) -> dict:
    tenant_limits.delete(state.store, tenant)
    record_event(state.store, "tenant", tenant, "LimitsDeleted", f"tenant {tenant} limits removed",
                 tenant=tenant, keep=state.settings.events_kept, max_age_s=state.settings.events_max_age_s)
    return {"kind": "tenant-limits", "tenant": tenant, "deleted": True}
