"""A tenant's inference limits at the gateway (common.tenant_limits).

    POST   /api/ai/tenant-limits            {"tenant": "acme", "max_context_tokens": 8192}: set (create or replace; admin)
    GET    /api/ai/tenant-limits            every tenant's; a tenant-bound caller sees its own
    DELETE /api/ai/tenant-limits/{tenant}   back to the gateway-wide limits (admin)

The gateway applies a change within its cache TTL (FABRIC_GATEWAY_CACHE_SECS).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from common.records import tenant_limits
from common.tenant_limits import TenantLimits
from controlplane.api.answers import TenantDeleted
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import gateway_config
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["tenancy"], dependencies=[Depends(require_admin)])


@router.post("/tenant-limits", status_code=201, response_model=TenantLimits)
def put_limits(body: TenantLimits, state: StateDep, who: PrincipalDep) -> dict:
    return gateway_config.set_tenant_limits(state, who, body).model_dump(mode="json")


@router.get("/tenant-limits", response_model=list[TenantLimits])
def list_limits(state: StateDep, who: PrincipalDep) -> list[dict]:
    return [t.model_dump(mode="json") for t in tenant_limits.list(state.store)
            if not who.bound or t.tenant == who.tenant]


@router.delete("/tenant-limits/{tenant}", response_model=TenantDeleted)
def delete_limits(tenant: str, state: StateDep, who: PrincipalDep) -> dict:
    gateway_config.delete_tenant_limits(state, who, tenant)
    return {"kind": "tenant-limits", "tenant": tenant, "deleted": True}
