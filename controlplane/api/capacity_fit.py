"""How many more replicas of a profile fit now (controlplane.placement.capacity decides).

  GET /api/ai/capacity/fit?profile=NAME[&model=NAME][&allowed_sites=a,b][&residency=R]
      -> {profile, replica: what one replica takes, fits, with_preemption: {standard, critical},
          binding: the constraint most nodes share, nodes: [{node, site, fits, binding, detail,
          with_preemption}], sites: [{site, fits, with_preemption, binding}]}

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
from common.schemas import check_name
from controlplane.auth import require_admin
from controlplane.orchestration_state import load_snapshot
from controlplane.placement.capacity import fit
from controlplane.placement.preempt_apply import holders_of
from controlplane.records import models, profiles
from controlplane.settings import of as settings_of
from controlplane.state import AppState, get_state

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


class CapacityFit(BaseModel):
    profile: str
    model: str | None
    replica: ReplicaTakes
    fits: int = Field(..., description="more replicas that fit now, without preemption")
    with_preemption: dict[str, int]
    binding: str | None = Field(..., description="the constraint most nodes share (null: no nodes)")
    nodes: list[NodeFit]
    sites: list[SiteFit]


def _name(value: str, what: str) -> str:
    try:
        return check_name(value, what)
    except ValueError as exc:
        raise InvalidInput(str(exc), code="invalid_name") from None


@router.get("/capacity/fit", response_model=CapacityFit)
def capacity_fit(state: StateDep, profile: str = Query(..., min_length=1, max_length=128),
                 allowed_sites: str = Query("", max_length=2048, description="comma-separated site names"),
                 residency: str | None = Query(None, max_length=128),
                 model: str | None = Query(None, max_length=128)) -> dict:
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
    snap = load_snapshot(state.store)
    return fit(prof, list(snap.nodes.values()), snap.reserved_by_node(), snap.committed(), time.time(),
               settings_of(state).scheduler, holders_of(snap), allowed_sites=sites, residency=residency,
               sites=snap.sites, model=artifact)
