"""The routing plan as it is published: common.records.plans.PublishedPlan from the controller's
RoutingPlan, the rollout split and the spillover pools (pure); ``shown_plan``: the one explain,
the rollout explain and the console show, the published record, or for an endpoint no tick has
published yet the plan the next tick would publish (``live_plan``), marked as not published."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common.agent_api import MaglevServiceSpec
from common.records import plans
from common.records.plans import PlanEntry, PlanSplit, PublishedPlan, SpillPool
from common.schemas import InferenceEndpoint, Node, Replica, ReplicaObservation, Site
from common.store.base import Store
from controlplane.orchestration_state import Snapshot
from controlplane.routing.final import endpoint_plan
from controlplane.routing.split import Split
from controlplane.routing.strategies import RoutingPlan, plan_routing

PROTO = "tcp"


def to_published(ep: InferenceEndpoint, plan: RoutingPlan, split: Split | None, vip: str | None,
                 spill: Sequence[SpillPool], now: float, generation: int) -> PublishedPlan:
    """The record for ``plan``; its service (what the agents get) only with a VIP and IP backends."""
    service = None
    if vip is not None and plan.backends:
        service = MaglevServiceSpec(generation=generation, backends={f"{h}:{p}": w for h, p, w in plan.backends},
                                    draining=list(plan.draining), forwarding=ep.forwarding)
    return PublishedPlan(
        endpoint=ep.name, deployment=ep.deployment, generation=generation, decided_at=now, strategy=plan.strategy,
        vip=vip, port=ep.port, proto=PROTO, forwarding=ep.forwarding, service=service,
        entries=[PlanEntry(replica_id=e.replica_id, included=e.included, reason=e.reason, weight=e.weight,
                           host=e.host, port=e.port, maglev=e.in_maglev, draining=e.draining) for e in plan.entries],
        split=None if split is None else PlanSplit(percent=split.percent, table_share=split.table_share,
                                                   slot_error=split.slot_error),
        spill=list(spill))


def spill_pools(ep: InferenceEndpoint, replicas: Mapping[str, Sequence[Replica]],
                observations: Mapping[str, ReplicaObservation], nodes: Mapping[str, Node], now: float,
                sites: Mapping[str, Site] | None = None) -> list[SpillPool]:
    """The replicas of each spillover deployment calls may go to, by the endpoint's rules."""
    out = []
    for d in ep.spillover:
        p = plan_routing(ep, replicas.get(d, []), observations, nodes, now, sites=sites)
        out.append(SpillPool(deployment=d, replicas=sorted(e.replica_id for e in p.entries if e.included)))
    return out


def live_plan(ep: InferenceEndpoint, snap: Snapshot, now: float, generation: int = 1) -> PublishedPlan:
    """The plan the routing tick would publish for ``ep`` on ``snap``: its strategy, its active
    rollout's split, its VIP and spillover pools, with ``generation``."""
    plan, split = endpoint_plan(ep, snap.replicas.get(ep.deployment, []), snap.observations, snap.nodes, now,
                                rollout=snap.rollouts.get(ep.deployment), sites=snap.sites, vip=ep.status.vip)
    spill = spill_pools(ep, snap.replicas, snap.observations, snap.nodes, now, snap.sites)
    return to_published(ep, plan, split, ep.status.vip, spill, now, generation)


def shown_plan(store: Store, ep: InferenceEndpoint, snap: Snapshot, now: float) -> tuple[PublishedPlan, bool]:
    """(plan, published): ``ep``'s published plan, what the agents hold and the gateway routes on;
    without one for its deployment (no tick yet, or a record left by an earlier endpoint of that
    name), the plan the next tick would publish, and False."""
    plan = plans.get(store, ep.name)
    if plan is not None and plan.deployment == ep.deployment:
        return plan, True
    return live_plan(ep, snap, now), False
