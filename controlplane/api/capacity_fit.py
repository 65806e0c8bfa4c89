"""How many more replicas of a profile fit now (controlplane.placement.capacity decides).

  GET /api/ai/capacity/fit?profile=NAME[&model=NAME][&allowed_sites=a,b][&residency=R][&tenant=T]
      -> {profile, replica: what one replica takes, fits, with_preemption: {standard, critical},
          binding: the constraint most nodes share, nodes: [{node, site, fits, binding, detail,
          with_preemption}], sites: [{site, fits, with_preemption, binding}], tenant}

With ``tenant`` the answer's ``tenant`` says the room its quota leaves (GPUs, CPU cores, memory;
controlplane.tenancy.quotas.room), how many replicas of the profile that room takes, and
``fits_for_tenant``: the smaller of that and ``fits``.

With ``model`` the node's free model-cache disk is checked against the model's declared size (and
the model's own residency joins the site rules). "fits" is without preemption (draining replicas still hold their room); "with_preemption" is per
capacity class, counting the lower classes' replicas as gone down to each deployment's floor.
Read-only; the same read permission as GET /api/ai/capacity.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from common.errors import InvalidInput, NotFound
from common.records import models, profiles
from common.schemas import check_name
from controlplane.auth import require_admin
from controlplane.orchestration_state import load_snapshot
from controlplane.placement.capacity import fit
from controlplane.reconcile.preempt_apply import holders_of
from controlplane.state import AppState, get_state
from controlplane.tenancy import quotas

StateDep = Annotated[AppState, Depends(get_state)]
router = APIRouter(prefix="/api/ai", tags=["orchestration"], dependencies=[Depends(require_admin)])
MAX_SITES = 64


class ReplicaTakes(BaseModel):
    gpus: int
    vram_gib: float
    gpu_model: str | None
    mig_profile: str | None
    cpu: int
    memory_gib: float


class NodeFit(BaseModel):
    node: str
    site: str
    fits: int
    binding: str
    detail: str
    with_preemption: dict[str, int] = Field(..., description="replicas that fit per capacity class, counting "
                                            "the lower classes' replicas as gone")


class SiteFit(BaseModel):
    site: str
    fits: int
    with_preemption: dict[str, int]
    binding: str | None


class TenantRoom(BaseModel):
    tenant: str
    quota: bool = Field(..., description="whether the tenant has a quota record (false: not limited)")
    room: dict[str, float | None] = Field(..., description="what the quota still allows: gpus, cpu, memory_gib "
                                          "(null: not limited)")
    replicas: int | None = Field(..., description="replicas of the profile that room takes (null: no limit)")
    fits_for_tenant: int = Field(..., description="fits, capped by the tenant's room")


class CapacityFit(BaseModel):
    profile: str
    model: str | None
    replica: ReplicaTakes
    fits: int = Field(..., description="more replicas that fit now, without preemption")
    with_preemption: dict[str, int]
    binding: str | None = Field(..., description="the constraint most nodes share (null: no nodes)")
    nodes: list[NodeFit]
    sites: list[SiteFit]
    tenant: TenantRoom | None = None


def _name(value: str, what: str) -> str:
    try:
        return check_name(value, what)
    except ValueError as exc:
        raise InvalidInput(str(exc), code="invalid_name") from None


@router.get("/capacity/fit", response_model=CapacityFit)
def capacity_fit(state: StateDep, profile: str = Query(..., min_length=1, max_length=128),
                 allowed_sites: str = Query("", max_length=2048, description="comma-separated site names"),
                 residency: str | None = Query(None, max_length=128),
                 model: str | None = Query(None, max_length=128),
                 tenant: str | None = Query(None, max_length=128)) -> dict:
    name = _name(profile, "profile")
    sites = [_name(s.strip(), "site") for s in allowed_sites.split(",") if s.strip()]
    if len(sites) > MAX_SITES:
        raise InvalidInput(f"allowed_sites names {len(sites)} sites; at most {MAX_SITES}", code="invalid")
    residency = _name(residency, "residency") if residency else None
    prof = profiles.require(state.store, name)
    artifact = None
    if model:
        artifact = models.get(state.store, _name(model, "model"))
        if artifact is None:
            raise NotFound(f"model {model!r} not found")
        if artifact.residency and residency and artifact.residency != residency:
            raise InvalidInput(f"residency {residency!r} differs from model {model}'s residency "
                               f"{artifact.residency!r}", code="residency_conflict")
        residency = residency or artifact.residency
    who = _name(tenant, "tenant") if tenant else None
    snap = load_snapshot(state.store)
    answer = fit(prof, list(snap.nodes.values()), snap.reserved_by_node(), snap.committed(), time.time(),
                 state.settings.scheduler, holders_of(snap), allowed_sites=sites, residency=residency,
                 sites=snap.sites, model=artifact, taker=who)  # preemption as the planner does it for who
    if who is not None:
        answer["tenant"] = tenant_room(state.store, who, prof, answer["fits"])
    return answer


def tenant_room(store, tenant: str, prof, fits: int) -> dict:
    """The tenant's room under its quota and the replicas of ``prof`` it takes (docstring above)."""
    quota = quotas.load_quota(store, tenant)
    one = quotas.Amount(prof.gpu.count, prof.cpu, prof.memory_gib)
    if quota is None:
        return {"tenant": tenant, "quota": False, "room": {"gpus": None, "cpu": None, "memory_gib": None},
                "replicas": None, "fits_for_tenant": fits}
    left = quotas.room(quota, quotas.tenant_usage(store, tenant))
    replicas = quotas.replicas_within(left, one)
    return {"tenant": tenant, "quota": True, "room": left, "replicas": replicas,
            "fits_for_tenant": fits if replicas is None else min(fits, replicas)}
