"""Autoscaling: set a deployment's autoscaling spec and explain what the autoscaler decides.

  PUT /api/ai/deployments/{name}/autoscaling   body: common.schemas.AutoscalingSpec; stored on the
                                               deployment (enabled: false keeps the spec, stops it;
                                               controlplane.ops.deployments.set_autoscaling)
  GET /api/ai/explain/scaling/{name}           the decision the next autoscaler tick would make, the
                                               instantaneous signal, each condition with its
                                               threshold and how long it has held, the quota

The explanation runs controlplane.scaling.loop.plan_for, the same function the loop runs.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from common.errors import NotFound
from common.schemas import AutoscalingSpec, InferenceDeployment
from controlplane.api.answers import ScalingExplained
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import deployments as deployment_ops
from controlplane.orchestration_state import load_snapshot
from controlplane.scaling.decide import FRESH_S
from controlplane.scaling.loop import plan_for
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["scaling"], dependencies=[Depends(require_admin)])


@router.put("/deployments/{name}/autoscaling", response_model=InferenceDeployment)
def put_autoscaling(name: str, body: AutoscalingSpec, state: StateDep, who: PrincipalDep) -> dict:
    return deployment_ops.set_autoscaling(state, who, name, body).model_dump(mode="json")


def _condition(value: float | None, threshold: float | None, holding: bool, held_s: float,
               needed_s: float | None) -> dict:
    return {"value": value, "threshold": threshold, "holding": holding, "held_s": round(held_s, 3),
            "needed_s": needed_s}


@router.get("/explain/scaling/{name}", response_model=ScalingExplained,
            response_model_exclude_unset=True)
def explain_scaling(name: str, state: StateDep) -> dict:
    snap = load_snapshot(state.store)
    dep = snap.deployments.get(name)
    if dep is None:
        raise NotFound(f"deployment {name!r} not found")
    spec = dep.autoscaling
    decision, memory = plan_for(state.store, snap, dep, time.time())
    sig = decision.signal
    body: dict = {
        "deployment": name,
        "enabled": bool(spec and spec.enabled),
        "autoscaling": spec.model_dump(mode="json") if spec else None,
        "decision": {"action": decision.action, "replicas": decision.replicas, "code": decision.code,
                     "reason": decision.reason, "summary": decision.summary},
        "signal": {"desired": sig.desired, "ready": sig.ready, "fresh": sig.fresh, "queue_depth": sig.queue_depth,
                   "ttft_ms": sig.ttft_ms, "stale": list(sig.stale), "fresh_within_s": FRESH_S},
        "memory": {"last_scale_at": memory.last_scale_at, "last_action": memory.last_action},
        "status": {"scaling": dep.status.scaling, "message": dep.status.message},
    }
    if spec is not None:
        q = sig.queue_depth
        body["conditions"] = {
            "scale_out_queue": _condition(q, spec.scale_out_queue, q is not None and q > spec.scale_out_queue,
                                          sig.out_held_s, spec.scale_out_seconds),
            "scale_out_ttft_ms": _condition(sig.ttft_ms, spec.scale_out_ttft_ms,
                                            spec.scale_out_ttft_ms is not None and sig.ttft_ms is not None
                                            and sig.ttft_ms > spec.scale_out_ttft_ms, 0.0, None),
            "scale_in_queue": _condition(q, spec.scale_in_queue,
                                         q is not None and q < spec.scale_in_queue and not sig.stale,
                                         sig.in_held_s, spec.scale_in_seconds),
        }
    return body
