"""Revisions and rollouts of a deployment, and the rollout explain view. Admin only.

  GET  /api/ai/deployments/{name}/revisions              every revision, oldest first
  POST /api/ai/deployments/{name}/revisions              {model?, profile?, engine_args?, reason}
                                                         -> revision N+1 (omitted fields: the
                                                         newest revision's); 409 when unchanged
  GET  /api/ai/deployments/{name}/revisions/{revision}
  POST /api/ai/deployments/{name}/rollouts               RolloutRequest -> 201 record
  POST /api/ai/deployments/{name}/rollout                the same operation (the product's singular name)
  GET  /api/ai/deployments/{name}/rollouts               every rollout, oldest first
  GET  /api/ai/deployments/{name}/rollouts/{id}
  POST /api/ai/deployments/{name}/rollouts/{id}/{pause|resume|promote|rollback}
  GET  /api/ai/explain/rollout/{deployment}              where the newest rollout is and why

Every change is an operation of controlplane.ops.rollouts (a revision's references and tenant
policy, a start's surge against the tenant's quota, an operator action's compare-and-swap); these
routes only adapt requests to it.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends

from common.errors import NotFound
from common.records import rollouts as rollout_records
from common.rollouts import Revision, Rollout, RolloutRequest
from controlplane.api.answers import RolloutExplained
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import rollouts as rollout_ops
from controlplane.orchestration_state import load_snapshot
from controlplane.rollouts.plan import healthy, is_ready, window_of
from controlplane.routing.publish import shown_plan
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["rollouts"])
AdminDep = Annotated[str, Depends(require_admin)]


@router.get("/deployments/{name}/revisions", response_model=list[Revision])
def list_revisions(name: str, state: StateDep, _: AdminDep) -> list[dict]:
    dep = rollout_ops.deployment(state, name)
    return [r.model_dump(mode="json") for r in rollout_ops.ensure_first_revision(state, dep)]


@router.post("/deployments/{name}/revisions", status_code=201, response_model=Revision)
def create_revision(name: str, body: rollout_ops.RevisionRequest, state: StateDep, caller: PrincipalDep) -> dict:
    return rollout_ops.create_revision(state, caller, name, body).model_dump(mode="json")


@router.get("/deployments/{name}/revisions/{revision}", response_model=Revision)
def get_revision(name: str, revision: int, state: StateDep, _: AdminDep) -> dict:
    dep = rollout_ops.deployment(state, name)
    rollout_ops.ensure_first_revision(state, dep)
    rev = rollout_records.get_revision(state.store, name, revision)
    if rev is None:
        raise NotFound(f"revision {revision} of deployment {name!r} not found")
    return rev.model_dump(mode="json")


@router.post("/deployments/{name}/rollouts", status_code=201, response_model=Rollout)
@router.post("/deployments/{name}/rollout", status_code=201, response_model=Rollout)
def start_rollout(name: str, body: RolloutRequest, state: StateDep, caller: PrincipalDep, _: AdminDep) -> dict:
    return rollout_ops.start(state, caller, name, body).model_dump(mode="json")


@router.get("/deployments/{name}/rollouts", response_model=list[Rollout])
def list_rollouts(name: str, state: StateDep, _: AdminDep) -> list[dict]:
    rollout_ops.deployment(state, name)
    return [r.model_dump(mode="json") for r, _m in rollout_records.list_rollouts(state.store, name)]


def _rollout(state, name: str, rollout_id: int) -> tuple[Rollout, int]:
    got = rollout_records.get_rollout(state.store, name, rollout_id)
    if got is None:
        raise NotFound(f"rollout {rollout_id} of deployment {name!r} not found")
    return got


@router.get("/deployments/{name}/rollouts/{rollout_id}", response_model=Rollout)
def get_rollout(name: str, rollout_id: int, state: StateDep, _: AdminDep) -> dict:
    return _rollout(state, name, rollout_id)[0].model_dump(mode="json")


@router.post("/deployments/{name}/rollouts/{rollout_id}/{action}", response_model=Rollout)
def operate_rollout(name: str, rollout_id: int, action: str, state: StateDep, caller: PrincipalDep,
                    _: AdminDep) -> dict:
    return rollout_ops.act(state, caller, name, rollout_id, action).model_dump(mode="json")


@router.get("/explain/rollout/{deployment}", response_model=RolloutExplained,
            response_model_exclude_unset=True)
def explain_rollout(deployment: str, state: StateDep, _: AdminDep) -> dict:
    snap = load_snapshot(state.store)
    dep = snap.deployments.get(deployment)
    if dep is None:
        raise NotFound(f"deployment {deployment!r} not found")
    recs = rollout_records.list_rollouts(state.store, deployment)
    body: dict = {"deployment": deployment, "revision": dep.revision, "rollout": None}
    if not recs:
        body["message"] = f"no rollout; revision {dep.revision} serves every replica"
        return body
    rec = recs[-1][0]
    now = time.time()
    replicas = snap.replicas.get(deployment, [])
    new = [r for r in replicas if r.revision == rec.to_revision]
    _, window = window_of(rec, new, snap.observations)
    sets = {}
    for label, rev in (("old", rec.from_revision), ("new", rec.to_revision)):
        mine = [r for r in replicas if r.revision == rev]
        sets[label] = {"revision": rev, "target": rec.old_target if label == "old" else rec.new_target,
                       "replicas": len(mine), "ready": sum(1 for r in mine if is_ready(r)),
                       "healthy": sum(1 for r in mine if healthy(r, now, rec.min_healthy_secs)),
                       "members": [{"replica_id": r.replica_id, "phase": r.phase, "ready": r.ready,
                                    "draining": r.draining, "host": r.host, "port": r.port}
                                   for r in sorted(mine, key=lambda r: r.ordinal)]}
    held = None if rec.step_started_at is None else round(now - rec.step_started_at, 1)
    body.update(rollout=rec.model_dump(mode="json"), phase=rec.phase, message=rec.message, sets=sets,
                step_held_secs=held,
                window={"finished": window.finished, "failed": window.failed, "error_rate": window.error_rate,
                        "mean_ttft_ms": window.mean_ttft_ms, "min_requests": rec.thresholds.min_requests})
    endpoints = []
    for ep in sorted((e for e in snap.endpoints.values() if e.deployment == deployment), key=lambda e: e.name):
        plan, published = shown_plan(state.store, ep, snap, now)  # routing explain's object
        endpoints.append({"endpoint": ep.name, "share_percent": rec.share,
                          "table_share": None if plan.split is None else plan.split.table_share,
                          "slot_error": None if plan.split is None else plan.split.slot_error,
                          "weights": plan.routed(), "published": published,
                          "generation": plan.generation if published else None})
    body["endpoints"] = endpoints
    return body
