"""An endpoint's final weights: the strategy's plan times the active rollout's share.

One function, called by everyone who shows or pushes weights: the routing controller (what the
agents get), GET /api/ai/explain/routing/{endpoint}, the rollout explain route and, through the
routing explain, the console's weight bars. They cannot drift apart (a canary's split used to
reach the agents while explain showed the strategy's weights alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common.rollouts import Rollout
from common.schemas import InferenceEndpoint, Node, Replica, ReplicaObservation, Site
from controlplane.routing.rollout_weights import apply_rollout
from controlplane.routing.split import Split
from controlplane.routing.strategies import RoutingPlan, plan_routing


def endpoint_plan(endpoint: InferenceEndpoint, replicas: Sequence[Replica],
                  observations: Mapping[str, ReplicaObservation], nodes: Mapping[str, Node], now: float, *,
                  rollout: Rollout | None = None, sites: Mapping[str, Site] | None = None,
                  vip: str | None = None) -> tuple[RoutingPlan, Split | None]:
    """The plan the agents carry for ``endpoint`` and the rollout split that shaped it (None
    without an active canary or blue/green share)."""
    plan = plan_routing(endpoint, replicas, observations, nodes, now, sites=sites, vip=vip)
    return apply_rollout(plan, replicas, rollout, now)
