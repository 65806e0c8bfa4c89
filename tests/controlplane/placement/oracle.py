"""The placement walk as it was before the free-capacity index: every node judged in id order,
the best score, ties on node id. Kept as the oracle the index is checked against (the index must
give this plan for the same inputs), and as the baseline scripts/bench-control times."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from common.schemas import InferenceDeployment, InferenceProfile, ModelArtifact, Node, Replica, Site
from controlplane.placement.scheduler import (
    NOTHING_COMMITTED,
    Committed,
    NodeVerdict,
    PlacementPlan,
    SchedulerSettings,
    judge_node,
)


def walk_place(
    deployment: InferenceDeployment,
    profile: InferenceProfile,
    model: ModelArtifact,
    nodes: Sequence[Node],
    reservations: Mapping[str, Collection[str]],
    now: float,
    settings: SchedulerSettings = SchedulerSettings(),
    *,
    replicas: Sequence[Replica] = (),
    exclude: Collection[str] = (),
    committed: Mapping[str, Committed] | None = None,
    sites: Mapping[str, Site] | None = None,
) -> PlacementPlan:
    committed = committed or {}
    domains = {n.id: n.failure_domain for n in nodes}
    site_of = {n.id: n.site for n in nodes}
    verdicts: list[NodeVerdict] = []
    for node in sorted(nodes, key=lambda n: n.id):
        if node.id in exclude:
            verdicts.append(NodeVerdict(node.id, False, "excluded: the replica is being moved off this node"))
            continue
        verdicts.append(
            judge_node(node, deployment, profile, model, reservations.get(node.id, ()), replicas, domains, now,
                       settings, committed.get(node.id, NOTHING_COMMITTED), sites, site_of)
        )
    fits = [v for v in verdicts if v.eligible]
    if not fits:
        if not nodes:
            message = "no nodes are registered"
        else:
            message = "no node can take a replica: " + "; ".join(f"{v.node}: {v.reason}" for v in verdicts)
        return PlacementPlan(deployment.name, None, (), message, tuple(verdicts))
    best = min(fits, key=lambda v: (-v.score, v.node))
    return PlacementPlan(
        deployment.name, best.node, best.gpus, f"chose {best.node}: {best.reason}", tuple(verdicts)
    )
