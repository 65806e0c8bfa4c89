"""Orchestration views and actions: explain placement/routing, deployment metrics, drain, capacity.

Explain placement runs the scheduler's pure planner (placement.index.place) on the current store
contents, so what it says is what the next reconcile pass will do. Explain routing shows the
endpoint's published plan (common.records.plans): the one object the routing controller pushed
to the agents and the gateway routes on, with its generation; for an endpoint no routing tick has
published yet it computes the plan the next tick would publish (routing.publish.live_plan) and
says so (``published`` false, ``generation`` null). All routes need an admin bearer token.

  GET  /api/ai/explain/placement/{deployment}   chosen node for the next replica, reason per node
  GET  /api/ai/explain/routing/{endpoint}       each replica included/excluded, reason, metrics, weight,
                                                the plan's generation
  GET  /api/ai/deployments/{name}/metrics       the last scrape of each replica
  POST /api/ai/deployments/{name}/drain         {"grace_secs": 30, "replica": null} (or "grace_seconds")
  POST /api/ai/deployments/{name}/restart       unpark a CrashLoop (or Backoff) deployment: zero its
                                                failure count, so the reconciler creates replicas again
  GET  /api/ai/capacity                         free/total GPUs by node and by site, GPUs held by
                                                capacity class (gpus_by_class), allocated VIPs;
                                                per node CPU and memory: allocatable (what the node
                                                reports), committed (its replicas' profiles), free

Drain without ``replica`` scales the deployment to 0 and drains every replica (weight 0 now,
deleted after the grace); with ``replica`` only that one drains and the reconciler replaces it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import AliasChoices, BaseModel, Field

from common.cold_phase import cold_phase
from common.errors import NotFound
from common.schemas import Spec
from controlplane.api.answers import Drained, Restarted
from controlplane.api.nodes import node_resources
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import drain as drain_ops
from controlplane.orchestration_state import Snapshot, load_snapshot
from controlplane.placement import vip_pool
from controlplane.placement.index import place
from controlplane.placement.scheduler import NOTHING_COMMITTED, node_online
from controlplane.routing.publish import shown_plan
from controlplane.state import AppState, get_state

StateDep = Annotated[AppState, Depends(get_state)]
router = APIRouter(prefix="/api/ai", tags=["orchestration"], dependencies=[Depends(require_admin)])


class DrainRequest(Spec):
    grace_secs: float = Field(30.0, ge=0, le=86400, description="seconds at weight 0 before deletion "
                              "(grace_seconds is accepted too)",
                              validation_alias=AliasChoices("grace_secs", "grace_seconds"))
    replica: str | None = Field(None, description="drain only this replica id")


class PlacedReplica(BaseModel):
    replica_id: str
    ordinal: int
    node: str
    gpus: list[str]
    phase: str


class SiteRules(BaseModel):
    allowed_sites: list[str]
    residency: str | None
    model_residency: str | None
    preferred_site: str | None
    minimum_sites: int
    max_replicas_per_site: int | None
    replicas_by_site: dict[str, int]


class NodeJudged(BaseModel):
    node: str
    eligible: bool
    chosen: bool
    score: int | float
    reason: str


class PlacementExplained(BaseModel):
    """The next replica's node and every node's verdict; without the profile or model only
    ``node`` (null), ``gpus``, ``message`` and ``nodes`` ([]) follow the site rules."""
    deployment: str
    replicas: list[PlacedReplica]
    sites: SiteRules
    node: str | None
    gpus: list[str]
    message: str | None
    nodes: list[NodeJudged]
    capacity_class: str | None = None
    preempted: int | None = None
    preempted_by: str | None = None
    preemption: dict[str, Any] | None = Field(None, description="when no node fits: what the preemption "
                                              "planner would do (outcome, node, gpus, message, waiting_on, victims)")


class RoutedReplica(BaseModel):
    replica_id: str
    included: bool
    reason: str
    weight: int
    host: str | None
    port: int
    maglev: bool
    metrics: dict[str, Any] = Field(..., description="the replica's last stored scrape")


class RoutedBackend(BaseModel):
    backend: str = Field(..., description="host:port")
    weight: int
    draining: bool


class RoutingExplained(BaseModel):
    endpoint: str
    deployment: str
    strategy: str
    vip: str | None
    port: int
    forwarding: str
    published: bool = Field(..., description="the routing controller's published plan (false: none published "
                            "yet for this endpoint and deployment, so the plan its next tick would publish)")
    generation: int | None = Field(..., description="the published plan's generation (what the agents hold)")
    decided_at: float = Field(..., description="when the plan was decided (unix seconds)")
    split: dict[str, Any] | None = Field(None, description="the rollout share the weights realise: percent, "
                                         "table_share, slot_error")
    replicas: list[RoutedReplica]
    backends: list[RoutedBackend]
    # with no replica ready: the phase a held call waits in (common.cold_phase, the gateway's function too)
    cold_start: dict | None = None


class ReplicaMetrics(BaseModel):
    replica_id: str
    ordinal: int
    node: str
    phase: str
    host: str | None
    port: int
    health_failures: int
    ready: bool
    draining: bool
    metrics: dict[str, Any] | None = Field(..., description="the last scrape (null: none yet)")


class DeploymentMetrics(BaseModel):
    deployment: str
    replicas: list[ReplicaMetrics]


class NodeCapacity(BaseModel):
    node: str
    site: str
    online: bool
    taints: list[str]
    gpus_total: int
    gpus_reserved: int
    gpus_free: int
    mig_slices: int
    mig_slices_free: int
    replicas: int
    cpu_allocatable: int
    cpu_committed: int
    cpu_free: int
    memory_allocatable_gib: float
    memory_committed_gib: float
    memory_free_gib: float


class SiteCapacity(BaseModel):
    site: str
    nodes: int
    gpus_total: int
    gpus_free: int


class VipHeld(BaseModel):
    vip: str
    endpoint: str


class Capacity(BaseModel):
    gpus_total: int
    gpus_free: int
    gpus_by_class: dict[str, int]
    nodes: list[NodeCapacity]
    sites: list[SiteCapacity]
    vips: list[VipHeld]


def _by_site(replicas, nodes) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in replicas:
        node = nodes.get(r.node)
        site = node.site if node is not None else ""
        out[site] = out.get(site, 0) + 1
    return out


@router.get("/explain/placement/{deployment}", response_model=PlacementExplained,
            response_model_exclude_unset=True)
def explain_placement(deployment: str, state: StateDep, caller: PrincipalDep) -> dict:
    snap = load_snapshot(state.store)
    dep = snap.deployments.get(deployment)
    if dep is None:
        raise NotFound(f"deployment {deployment!r} not found")
    replicas = snap.replicas.get(deployment, [])
    body: dict = {
        "deployment": deployment,
        "replicas": [{"replica_id": r.replica_id, "ordinal": r.ordinal, "node": r.node, "gpus": r.gpus,
                      "phase": r.phase} for r in sorted(replicas, key=lambda r: r.ordinal)],
        # the site rules every node below was judged by (docs/sites.md)
        "sites": {"allowed_sites": dep.allowed_sites, "residency": dep.residency,
                  "model_residency": getattr(snap.models.get(dep.model), "residency", None),
                  "preferred_site": dep.preferred_site, "minimum_sites": dep.minimum_sites,
                  "max_replicas_per_site": dep.max_replicas_per_site,
                  "replicas_by_site": _by_site(replicas, snap.nodes)},
    }
    profile, model = snap.profiles.get(dep.profile), snap.models.get(dep.model)
    if profile is None or model is None:
        missing = f"model {dep.model!r}" if model is None else f"profile {dep.profile!r}"
        body.update(node=None, gpus=[], message=f"{missing} does not exist", nodes=[])
        return body
    live = [r for r in replicas if not r.draining and r.phase != "Deleting"]
    plan = place(dep, profile, model, list(snap.nodes.values()), snap.reserved_by_node(), time.time(),
                 state.settings.scheduler, replicas=live, committed=snap.committed(), sites=snap.sites)
    body.update(
        node=plan.node, gpus=list(plan.gpus), message=plan.message,
        nodes=[{"node": v.node, "eligible": v.eligible, "chosen": v.node == plan.node, "score": v.score,
                "reason": v.reason} for v in plan.verdicts],
    )
    by = snap.deployments.get(dep.status.preempted_by or "")
    body.update(capacity_class=dep.capacity_class, preempted=dep.status.preempted,  # another tenant's: unnamed
                preempted_by=dep.status.preempted_by if by is None or not caller.bound or by.tenant == caller.tenant
                else "another tenant's deployment")
    if plan.node is None:  # what the reconciler's preemption planner would do (docs/capacity.md)
        from controlplane.placement.preemption import plan_preemption
        from controlplane.reconcile import preempt_apply

        index = preempt_apply.snapshot_index(snap, time.time(), state.settings.scheduler)
        body["preemption"] = plan_preemption(index, dep, profile, model, preempt_apply.holders_of(snap),
                                             replicas=live).as_dict(viewer=caller.tenant_filter)
    return body


@router.get("/explain/routing/{endpoint}", response_model=RoutingExplained)
def explain_routing(endpoint: str, state: StateDep) -> dict:
    snap = load_snapshot(state.store)
    ep = snap.endpoints.get(endpoint)
    if ep is None:
        raise NotFound(f"endpoint {endpoint!r} not found")
    plan, published = shown_plan(state.store, ep, snap, time.time())  # what the agents and gateways hold
    service = plan.service
    replicas = snap.replicas.get(ep.deployment, [])
    return {
        "endpoint": endpoint, "deployment": ep.deployment, "strategy": plan.strategy, "vip": plan.vip,
        "port": plan.port, "forwarding": plan.forwarding, "published": published,
        "generation": plan.generation if published else None, "decided_at": plan.decided_at,
        "split": None if plan.split is None else plan.split.model_dump(),
        "replicas": [{"replica_id": e.replica_id, "included": e.included, "reason": e.reason, "weight": e.weight,
                      "host": e.host, "port": e.port, "maglev": e.maglev, "metrics": _last_scrape(snap, e.replica_id)}
                     for e in plan.entries],
        "backends": [] if service is None else [{"backend": b, "weight": w, "draining": b in service.draining}
                                                for b, w in service.backends.items()],
        "cold_start": None if any(r.ready and not r.draining for r in replicas) else
        cold_phase(snap.deployments.get(ep.deployment), replicas).as_dict(),
    }


def _last_scrape(snap: Snapshot, replica_id: str) -> dict:
    obs = snap.observations.get(replica_id)
    return {} if obs is None else obs.model_dump(exclude={"replica_id"})


@router.get("/deployments/{name}/metrics", response_model=DeploymentMetrics)
def deployment_metrics(name: str, state: StateDep) -> dict:
    snap = load_snapshot(state.store)
    if name not in snap.deployments:
        raise NotFound(f"deployment {name!r} not found")
    out = []
    for r in sorted(snap.replicas.get(name, []), key=lambda r: r.ordinal):
        obs = snap.observations.get(r.replica_id)
        out.append({"replica_id": r.replica_id, "ordinal": r.ordinal, "node": r.node, "phase": r.phase,
                    "host": r.host, "port": r.port, "health_failures": r.health_failures,
                    "ready": r.ready, "draining": r.draining,
                    "metrics": obs.model_dump(exclude={"replica_id"}) if obs else None})
    return {"deployment": name, "replicas": out}


@router.post("/deployments/{name}/drain", status_code=202, response_model=Drained)
def drain(name: str, body: DrainRequest, state: StateDep, who: PrincipalDep) -> dict:
    drained = drain_ops.drain_deployment(state, who, name, body.grace_secs, body.replica)
    return {"deployment": name, "drained": drained.replicas, "delete_after": drained.delete_after}


@router.post("/deployments/{name}/restart", response_model=Restarted)
def restart(name: str, state: StateDep, who: PrincipalDep) -> dict:
    """Unpark: the crash-loop count goes to 0 and the phase to Pending; the next reconcile pass
    creates replicas again (controlplane.reconcile.crashloop)."""
    before = drain_ops.restart(state, who, name)
    return {"deployment": name, "previous_phase": before.get("phase"), "previous_failures": before.get("failures", 0),
            "last_failure": before.get("last_failure", "")}


@router.get("/capacity", response_model=Capacity)
def capacity(state: StateDep) -> dict:
    snap = load_snapshot(state.store)
    reserved = snap.reserved_by_node()
    now = time.time()
    settings = state.settings.scheduler
    committed = snap.committed()
    nodes, sites = [], {}
    for node in sorted(snap.nodes.values(), key=lambda n: n.id):
        held = committed.get(node.id, NOTHING_COMMITTED)
        # Whole GPUs; a GPU cut into MIG slices is counted once and is not free for whole-GPU use,
        # its slices are counted apart (controlplane/mig).
        mine = reserved.get(node.id, set())
        whole = [g for g in node.gpus if not g.mig_profile]
        slices = [g for g in node.gpus if g.mig_profile]
        total = len(whole)
        gpus_held = len([g for g in whole if g.pci in mine or g.mig_mode])
        online = node_online(node, now, settings)
        usable = online and not node.taints
        free = total - gpus_held if usable else 0
        slices_free = len([g for g in slices if g.pci not in mine]) if usable else 0
        nodes.append({"node": node.id, "site": node.site, "online": online, "taints": node.taints,
                      "gpus_total": total, "gpus_reserved": gpus_held, "gpus_free": free,
                      "mig_slices": len(slices), "mig_slices_free": slices_free,
                      "replicas": held.replicas, **node_resources(node, held)})
        site = sites.setdefault(node.site, {"site": node.site, "nodes": 0, "gpus_total": 0, "gpus_free": 0})
        site["nodes"] += 1
        site["gpus_total"] += total
        site["gpus_free"] += free
    from controlplane.placement.capacity import gpus_by_class

    return {
        "gpus_total": sum(n["gpus_total"] for n in nodes),
        "gpus_free": sum(n["gpus_free"] for n in nodes),
        "gpus_by_class": gpus_by_class(snap.all_replicas(), snap.deployments),
        "nodes": nodes,
        "sites": [sites[k] for k in sorted(sites)],
        "vips": [{"vip": ip, "endpoint": owner} for ip, owner in sorted(vip_pool.allocations(state.store).items())],
    }


