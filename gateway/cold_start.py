"""Cold start: a call for an endpoint with no ready replica records demand, then waits or says so,
truthfully.

The autoscaler (fabricd, controlplane.scaling) scales a deployment parked at zero replicas back
to max(1, min_replicas) when it sees demand newer than its last change. The gateway records that
demand in the store under keyspace.demand(endpoint) as {"at": unix seconds} (at most one write
per endpoint per DEMAND_WRITE_GAP_S per process, and only for an endpoint that exists and a
caller that authenticated, so names an attacker invents never reach the store). Then:
  - hold the call (gateway.hold: one wake per endpoint, bounded per endpoint and tenant, SSE
    keep-alive for a streamed call) until a replica is Ready (the call then proceeds) or the hold
    bound passes (``hold_bound``): the endpoint's ``hold_secs``, else FABRIC_GATEWAY_HOLD_SECS when
    set, else the start budget of the runtime its deployment's profile names (common.runtimes:
    600 s for vLLM, 900 s for TensorRT-LLM, 300 s for llama.cpp), so a call waits as long as
    such a replica may take to start and no longer;
  - then, or with a hold bound of 0, or with the waiting room full: 503 with Retry-After and an
    OpenAI-style error body ("model_loading": the model is loading), which the official openai
    SDK retries by itself.
A held call's explanation names the phase it waited in (common.cold_phase, the function
fabricd's explain routing uses too).
An endpoint whose replicas exist but none is ready (a replica restarting) gets the same answer:
from the caller's side it is the same wait.

"Loading" is said only when something is coming (``refusal``, a pure function of the
deployment record and its replicas): a replica is being created or is starting, the deployment
backs off between replacements, or it sits at zero replicas with autoscaling and scale_to_zero
(this call's demand wakes it). Otherwise the answer is 503 with a code naming the state and no
Retry-After, and the call is not held:
  deployment_parked       CrashLoop: replicas kept failing (the last reason is in the message);
                          `fabricctl ai deployment restart NAME` tries again
  deployment_failed       Failed (its model or profile is missing, its runtime is refused)
  deployment_unplaceable  replicas wanted, none exists, and no node can take one
  deployment_preempted    every replica was preempted by a higher capacity class (who took them is
                          in the message); they return by themselves when room does
  scaled_to_zero          zero replicas wanted and no autoscaling that would wake one
  deployment_deleting     being deleted
  deployment_missing      the endpoint names a deployment that does not exist
The state is read from the store only on this path (no ready replica), at most once a second
per endpoint and process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common.cold_phase import ColdPhase, cold_phase
from common.errors import FabricError, TransientError
from common.records import autoscaling, deployments, endpoints, profiles
from common.records import replicas as replica_records
from common.runtimes import start_budget
from common.schemas import InferenceDeployment, Replica
from common.store.base import Store
from gateway.hold import HeldStream, HoldPolicy, HoldRoom, Wake
from gateway.upstreams import EndpointView, UpstreamCache

RETRY_AFTER_S = 5.0
DEMAND_WRITE_GAP_S = 1.0
POLL_S = 0.5
DEMAND_MEMO_MAX = 10_000
STATE_TTL_S = 1.0


class ModelLoading(TransientError):
    """503 with Retry-After: the endpoint has no ready replica yet."""

    code = "model_loading"

    def __init__(self, message: str, retry_after: float = RETRY_AFTER_S):
        super().__init__(message, delay=retry_after)
        self.retry_after = retry_after


class NotServing(FabricError):
    """503 without Retry-After: nothing is coming until someone acts (the code says what)."""

    status = 503
    code = "not_serving"


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str
    loading: bool  # a replica is starting or will be: model_loading, Retry-After, the hold applies


UNPLACEABLE = ("no node can take a replica", "no nodes are registered")


def refusal(endpoint: str, deployment_name: str, dep: InferenceDeployment | None,
            replicas: list[Replica]) -> Refusal:
    """Why an endpoint with no ready replica cannot answer now, and whether that will pass."""
    if dep is None:
        return Refusal("deployment_missing", f"endpoint {endpoint!r} names deployment {deployment_name!r}, "
                       "which does not exist", False)
    phase, why = dep.status.phase, dep.status.message.split("; autoscaler: ", 1)[0]
    if phase == "Deleting":
        return Refusal("deployment_deleting", f"deployment {dep.name!r} is being deleted", False)
    if phase == "CrashLoop":
        return Refusal("deployment_parked", f"deployment {dep.name!r} is parked after {dep.status.failures} "
                       f"replica failures (last: {dep.status.last_failure or 'unknown'}); "
                       f"`fabricctl ai deployment restart {dep.name}` tries again", False)
    if phase == "Failed":
        return Refusal("deployment_failed", f"deployment {dep.name!r} failed: {why}", False)
    coming = [r for r in replicas if not r.draining and r.phase in ("Pending", "Starting", "Ready", "Unhealthy")]
    if not coming and dep.status.preempted and (phase == "Preempted" or dep.status.preempted >= dep.replicas):
        by = dep.status.preempted_by or "a deployment of a higher capacity class"
        return Refusal("deployment_preempted", f"deployment {dep.name!r} is fully preempted: its "
                       f"{dep.status.preempted} replica(s) were taken by {by} (capacity_class "
                       f"{dep.capacity_class}); they come back when room returns", False)
    if dep.replicas == 0 and not coming:
        scaler = dep.autoscaling
        if scaler is not None and scaler.enabled and scaler.scale_to_zero:
            return Refusal("model_loading", f"deployment {dep.name!r} is scaled to zero; this call starts a "
                           f"replica; retry in {RETRY_AFTER_S:g}s", True)
        return Refusal("scaled_to_zero", f"deployment {dep.name!r} is scaled to 0 replicas and does not "
                       "autoscale from zero; scale it up to serve", False)
    if not coming and phase == "Pending" and any(u in why for u in UNPLACEABLE):
        return Refusal("deployment_unplaceable", f"deployment {dep.name!r} cannot be placed: {why}", False)
    if phase == "Backoff":
        return Refusal("model_loading", f"deployment {dep.name!r} is backing off after a replica failure; "
                       f"a new replica follows; retry in {RETRY_AFTER_S:g}s", True)
    return Refusal("model_loading", f"the model behind endpoint {endpoint!r} is loading (no replica is ready "
                   f"yet); retry in {RETRY_AFTER_S:g}s", True)


def hold_bound(endpoint_secs: float | None, gateway_secs: float | None, runtime: str | None) -> float:
    """Pure: how long a call for an endpoint with no ready replica may be held. The endpoint's own
    ``hold_secs``, else the gateway's FABRIC_GATEWAY_HOLD_SECS, else the start budget of the
    endpoint's runtime (None: the profile is unknown; an unknown runtime reads as vLLM's)."""
    if endpoint_secs is not None:
        return endpoint_secs
    if gateway_secs is not None:
        return gateway_secs
    return start_budget(runtime or "vllm")


@dataclass
class ColdStart:
    store: Store
    upstreams: UpstreamCache
    hold: HoldPolicy = field(default_factory=HoldPolicy)
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic  # the hold's deadlines
    poll_s: float = POLL_S
    _written: dict[str, float] = field(default_factory=dict)  # endpoint -> monotonic time of last write
    _states: dict[str, tuple[float, Refusal, ColdPhase, float]] = field(default_factory=dict)
    _room: HoldRoom | None = None

    @property
    def room(self) -> HoldRoom:
        if self._room is None:
            self._room = HoldRoom(self.hold)
        return self._room

    async def view(self, endpoint: str, tenant: str = "", held: HeldStream | None = None,
                   notes: dict | None = None) -> EndpointView:
        """The endpoint's view once it has a ready replica; ModelLoading when none is ready but
        one is coming (after holding up to the hold bound); NotServing when none is coming.
        NotFound and other errors pass through. ``held``: a streamed call's send, opened (SSE
        head, keep-alive) once the call is held; ``notes``: the call's explanation, given the
        phase it waited in and for how long."""
        view = await self.ready_view(endpoint)
        if view is not None:
            return view
        why = await self.refusal(endpoint)
        if not why.loading:
            raise NotServing(why.message, code=why.code)
        await self.record_demand(endpoint)
        hit = self._states.get(endpoint)
        secs = hit[3] if hit is not None else hold_bound(None, self.hold.secs, None)
        if secs <= 0:
            raise ModelLoading(why.message)
        full = self.room.full(endpoint, tenant)
        if full is not None:
            raise ModelLoading(f"{why.message} ({full})")
        t0, entered = self.monotonic(), self.phase(endpoint)
        wake = self.room.enter(endpoint, tenant, lambda: Wake(lambda: self.ready_view(endpoint),
                                                              lambda: self._refresh(endpoint), self.poll_s))
        try:
            if held is not None:
                await held.open()
            view = await wake.wait(t0 + secs, held.open if held is not None else None, self.hold.keepalive_s,
                                   self.monotonic)
        finally:
            self.room.leave(endpoint, tenant, wake)
            if notes is not None and entered is not None:  # where it began waiting, where the wait ended
                last = self.phase(endpoint) or entered
                notes["cold_start"] = {**entered.as_dict(), "ended_in": last.phase, "hold_bound_s": secs,
                                       "held_s": round(self.monotonic() - t0, 3)}
        if view is None:
            raise ModelLoading(why.message)
        return view

    async def _refresh(self, endpoint: str) -> None:
        """The one wake's period: demand kept fresh, the phase re-read (at most once a second)."""
        await self.record_demand(endpoint)
        await self.refusal(endpoint)

    def phase(self, endpoint: str) -> ColdPhase | None:
        hit = self._states.get(endpoint)
        return hit[2] if hit is not None else None

    async def refusal(self, endpoint: str) -> Refusal:
        now = time.monotonic()
        hit = self._states.get(endpoint)
        if hit is not None and now - hit[0] < STATE_TTL_S:
            return hit[1]
        why, phase, bound = await asyncio.to_thread(self._read_state, endpoint)
        if len(self._states) >= DEMAND_MEMO_MAX:
            self._states.clear()
        self._states[endpoint] = (now, why, phase, bound)
        return why

    def _read_state(self, endpoint: str) -> tuple[Refusal, ColdPhase, float]:
        """(why no replica answers, the cold start's phase, the hold bound: ``hold_bound``)."""
        ep = endpoints.get(self.store, endpoint)
        if ep is None:  # deleted meanwhile: the loading answer is the old behaviour's
            return Refusal("model_loading", f"endpoint {endpoint!r} has no ready replica", True), \
                cold_phase(None, []), hold_bound(None, self.hold.secs, None)
        dep = deployments.get(self.store, ep.deployment)
        replicas = replica_records.list(self.store, ep.deployment)
        runtime = None
        if ep.hold_secs is None and self.hold.secs is None and dep is not None:  # the profile only when it decides
            profile = profiles.get(self.store, dep.profile)
            runtime = profile.runtime if profile is not None else None
        return (refusal(endpoint, ep.deployment, dep, replicas), cold_phase(dep, replicas),
                hold_bound(ep.hold_secs, self.hold.secs, runtime))

    async def ready_view(self, endpoint: str) -> EndpointView | None:
        """The endpoint's view when it can take the call now, else None (then ``view`` decides)."""
        try:
            view = await self.upstreams.view(endpoint)
        except TransientError as exc:
            if exc.code != "no_ready_replica":
                raise
            return None
        ep = view.endpoint  # a pool to spill to, a fallback or a provider is capacity too (gateway.dispatch)
        return view if view.replicas or ep.external or ep.fallbacks or any(p for _, p in view.spill_pools) else None

    async def record_demand(self, endpoint: str) -> None:
        now = time.monotonic()
        last = self._written.get(endpoint)
        if last is not None and now - last < DEMAND_WRITE_GAP_S:
            return
        if len(self._written) >= DEMAND_MEMO_MAX:  # endpoints come and go; keep the memo small
            self._written.clear()
        self._written[endpoint] = now
        await asyncio.to_thread(autoscaling.note_demand, self.store, endpoint, self.clock())
