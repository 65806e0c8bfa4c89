"""An endpoint's final weights: the strategy's plan times the active rollout's share.

One function, called by the routing controller, whose result it publishes as the endpoint's plan
(common.records.plans): the agents get that plan's service, and GET /api/ai/explain/routing, the
rollout explain and the console's weight bars show that record (routing.publish.shown_plan; for
an endpoint not published yet, this function's answer through routing.publish.live_plan). They
cannot drift apart (a canary's split used to reach the agents while explain showed the strategy's
weights alone).
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
