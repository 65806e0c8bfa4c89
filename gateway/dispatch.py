"""Where a call goes when its endpoint has more than one place to send it: spillover pools, the
priority bands' waiting room, external fallbacks, or an external provider (the glue between
gateway.capacity, gateway.bands and gateway.external; the decisions are theirs).

Order, for an endpoint whose pools are its deployment then its ``spillover`` deployments:
1. an external endpoint: the provider (gateway.external);
2. the first pool that is not saturated (gateway.capacity) -- a later one is a spill;
3. every pool saturated: the first ``fallbacks`` endpoint the caller's credential allows (a key's
   ``fallbacks``, or an OIDC claim naming it): only then does a prompt leave the cluster;
4. else, with a saturation measure configured, wait in the call's band (gateway.bands; fair
   shares between tenants by estimated tokens, a tenant-less caller its own) until a pool has
   room, then 2 again (a fallback is not tried twice);
5. else the preferred pool is kept (or 503 no_ready_replica when no pool has a replica).

Endpoints that use none of this never reach here (GatewayApp checks ``needed`` first), so the
common call costs nothing more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from common.errors import NotFound, TransientError
from common.schemas import InferenceEndpoint
from gateway.bands import QueueRefused, WaitingRoom
from gateway.capacity import Saturation, choose_pool
from gateway.key_auth import Identity
from gateway.upstreams import EndpointView, UpstreamCache


@dataclass(frozen=True)
class Placement:
    view: EndpointView  # its replicas are the chosen pool's
    external: InferenceEndpoint | None = None  # set: the call leaves for this provider endpoint
    notes: dict = field(default_factory=dict)  # for GET /api/ai/explain/request/{id}


def needed(view: EndpointView, measure: Saturation, queueing: bool) -> bool:
    ep = view.endpoint
    return bool(ep.external or ep.spillover or ep.fallbacks or (queueing and measure.measured))


def without_vip(view: EndpointView, replicas) -> EndpointView:
    """A spill pool's view: its replicas, directly (the VIP balances the preferred pool only)."""
    ep = view.endpoint
    return replace(view, replicas=replicas, weights={},
                   endpoint=ep.model_copy(update={"status": ep.status.model_copy(update={"vip": None})}))


@dataclass
class Dispatcher:
    upstreams: UpstreamCache
    measure: Saturation
    room: WaitingRoom | None = None
    on_spill: object = None  # callable(endpoint) for the metric
    on_fallback: object = None

    async def place(self, view: EndpointView, identity: Identity, band: str, request_id: str,
                    cost: int = 0) -> Placement:
        """``cost``: the call's estimated tokens, its weight in its band's fair shares while it waits."""
        ep = view.endpoint
        if ep.external is not None:
            return Placement(view, ep, {"external": ep.name})
        notes: dict = {}
        waited = False
        while True:
            pools = view.pools
            choice = choose_pool([p for _, p in pools], view.readings, self.measure, time.time())
            if len(pools) > 1:
                notes["pools"] = [{"deployment": d, "replicas": len(p), "saturated": s}
                                  for (d, p), s in zip(pools, choice.saturated)]
            if not choice.all_saturated:
                if choice.spilled:
                    notes["spilled_to"] = pools[choice.index][0]
                    if self.on_spill:
                        self.on_spill(ep.name)
                    return Placement(without_vip(view, pools[choice.index][1]), None, notes)
                return Placement(view, None, notes)
            notes["saturated"] = True
            if not waited:
                fallback = await self._fallback(ep, identity, notes)
                if fallback is not None:
                    if self.on_fallback:
                        self.on_fallback(ep.name)
                    return Placement(view, fallback, notes)
            has_replicas = any(p for _, p in pools)
            if waited or self.room is None or not self.measure.measured or not has_replicas:
                break
            notes["band"] = band
            try:
                waited_s = await self.room.wait(ep.name, band, request_id, self._has_room(ep.name),
                                                identity.tenant or identity.subject, cost)
            except QueueRefused as exc:
                exc.notes = notes  # what was tried before the wait (pools, fallbacks), for explain
                raise
            notes["queued_s"] = round(waited_s, 3)
            waited = True
            view = await self.upstreams.view(ep.name, need_upstream=False)
        if not view.replicas and not ep.status.vip:
            raise TransientError(f"endpoint {ep.name!r} has no ready replica and no fallback it may use",
                                 code="no_ready_replica")
        notes["kept_preferred"] = True
        return Placement(view, None, notes)

    def _has_room(self, endpoint: str):
        async def has_room() -> bool:
            try:
                view = await self.upstreams.view(endpoint, need_upstream=False)
            except NotFound:
                return True  # deleted meanwhile: let the call go and fail on its own terms
            return not choose_pool([p for _, p in view.pools], view.readings, self.measure, time.time()).all_saturated
        return has_room

    async def _fallback(self, ep: InferenceEndpoint, identity: Identity, notes: dict) -> InferenceEndpoint | None:
        for name in ep.fallbacks:
            if not identity.may_leave(name):
                notes.setdefault("fallbacks_not_allowed", []).append(name)
                continue
            try:
                fview = await self.upstreams.view(name, need_upstream=False)
            except NotFound:
                continue
            if fview.endpoint.external is None:
                continue
            notes["fallback"] = name
            return fview.endpoint
        return None
