"""Where a call goes: one interface over the gateway's four choices of target.

The pick stage of GatewayApp.call takes the first picker that applies (``Pickers.for_call``):

  external  dispatch placed the call at an external provider (gateway.dispatch, gateway.external):
            no replica; the call's cache salt is not added
  adapter   the body's model is a LoRA adapter of the endpoint: a replica of the pool holding it,
            loaded there if needed (gateway.adapters)
  scored    ``routing_l7`` prefix, round_robin or random: the gateway's own choice of replica
            (gateway.replica_router; prefix asks the agents' KV index first)
  affinity  ``routing_l7`` affinity, a dry run, or no replica to score: the endpoint's VIP first,
            else a rendezvous hash of the session (gateway.upstreams.order_targets)

Every picker answers a ``Pick``: the base URLs to try, best first (a connect failure moves to
the next), the explanation GET /api/ai/explain/request/{id} returns, and the replica whose token
load the call adds to while it runs (``ReplicaRouter.started`` .. ``finished``), when one was
chosen by the gateway. A dry run never picks a replica: it calls no upstream.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from common.schemas import InferenceEndpoint
from gateway.adapters import AdapterRouter
from gateway.capacity import replica_saturated
from gateway.proxy import VipConnections
from gateway.replica_router import ReplicaRouter
from gateway.request_body import BodyInfo
from gateway.router_gate import conversation_key
from gateway.routes import Route
from gateway.upstreams import EndpointView, order_targets, replica_target, replica_targets

if TYPE_CHECKING:
    from common.http1_client import UpstreamPool
    from gateway.dispatch import Dispatcher


@dataclass(frozen=True)
class PickInput:
    """What a picker may read of a call: its view (the chosen pool's replicas), parsed body, route
    and headers, and the provider endpoint when dispatch placed it at one."""
    view: EndpointView
    info: BodyInfo
    route: Route
    headers: dict[str, str]
    external: InferenceEndpoint | None = None


@dataclass(frozen=True)
class Pick:
    targets: list[str]  # base URLs, best first; empty for an external provider
    why: dict  # the explanation ("mode", "reason", and the picker's scores)
    replica: str | None = None  # chosen by the gateway: counted in the router's load while the call runs
    adapter: str | None = None  # the LoRA adapter the replica serves the call with
    external: InferenceEndpoint | None = None  # the provider endpoint the call leaves for


class Picker(Protocol):
    kind: str  # external | adapter | scored | affinity

    async def pick(self, call: PickInput) -> Pick: ...


def replica_urls(view: EndpointView, scheme: str) -> dict[str, str]:
    """Replica id -> base URL, for every replica of the view."""
    return {r.replica_id: replica_target(r, scheme) for r in view.replicas}


class ExternalPicker:
    kind = "external"

    async def pick(self, call: PickInput) -> Pick:
        return Pick([], {"mode": "external", "reason": "an external provider"}, external=call.external)


@dataclass
class AdapterPicker:
    adapters: AdapterRouter
    client: UpstreamPool
    router: ReplicaRouter  # its in-flight counts
    dispatcher: Dispatcher | None  # its saturation measure, when dispatch runs
    scheme: str
    kind = "adapter"

    async def pick(self, call: PickInput) -> Pick:
        adapter = call.info.model or ""
        picked, why = await self.replica(call.view, adapter)
        return Pick(replica_targets(call.view, picked, self.scheme), why, replica=picked, adapter=adapter)

    async def replica(self, view: EndpointView, adapter: str) -> tuple[str, dict]:
        """A replica of the view's pool holding the adapter (loading it there, unloading the least
        recently used idle one when the replica is full); the forward calls it again when the
        adapter was unloaded behind this gateway's back."""
        now = time.time()
        measure = self.dispatcher.measure if self.dispatcher is not None else None
        saturated = {r.replica_id for r in view.replicas
                     if measure is not None and replica_saturated(view.readings.get(r.replica_id), measure, now)}
        return await self.adapters.place(self.client, replica_urls(view, self.scheme), adapter, view.max_adapters,
                                         saturated, self.router.in_flight)


@dataclass
class ScoredPicker:
    router: ReplicaRouter
    scheme: str
    kind = "scored"

    async def pick(self, call: PickInput) -> Pick:
        data = call.info.data if call.route.kind == "generate" else None
        picked, why = await self.router.apick(call.view, data, time.time())
        return Pick(replica_targets(call.view, picked, self.scheme), why, replica=picked)


@dataclass
class AffinityPicker:
    vip_connections: VipConnections
    client: UpstreamPool
    scheme: str
    kind = "affinity"

    async def pick(self, call: PickInput) -> Pick:
        view, info = call.view, call.info
        # no x-session-id: the conversation's own key (its system prompt and first user
        # turn), so sessions on one shared system prompt do not all hash to one replica
        session = call.headers.get("x-session-id") or conversation_key(info.data) or info.prompt_head or None
        targets = order_targets(view, session, self.scheme)
        if view.endpoint.status.vip and targets:  # a drain must reach kept-alive VIP connections
            self.vip_connections.note(self.client, view.endpoint.name, targets[0], view.replicas)
        why = {"mode": "affinity", "reason": "the endpoint's VIP" if view.endpoint.status.vip else
               "rendezvous hash of the session" if session else "replica order"}
        return Pick(targets, why)


@dataclass(frozen=True)
class Pickers:
    external: ExternalPicker
    adapter: AdapterPicker
    scored: ScoredPicker
    affinity: AffinityPicker

    def for_call(self, view: EndpointView, info: BodyInfo, external: InferenceEndpoint | None,
                 dry: bool) -> Picker:
        """The first picker that applies, in the order of the module docstring."""
        if external is not None:
            return self.external
        if view.adapters and info.model in view.adapters and view.replicas and not dry:
            return self.adapter
        if view.endpoint.routing_l7 != "affinity" and view.replicas and not dry:
            return self.scored
        return self.affinity
