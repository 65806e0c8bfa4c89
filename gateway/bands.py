"""Priority bands: where a call waits at the gateway while every pool of its endpoint is saturated.

The pure part decides (plan_enqueue, expired, release_order); WaitingRoom applies it per gateway
process, one queue per endpoint.

- A call's band is its ``x-request-priority`` (low, normal, high), else its key's ``priority``,
  else normal.
- Each band holds at most ``per_band`` waiting calls; all bands of an endpoint together at most
  ``total``. A call arriving at a full band is refused (503 ``queue_full``).
- When the total is reached, a higher band is never refused while a lower band has queued work:
  the newest waiting call of the lowest band that has any is displaced (503 ``displaced`` with
  Retry-After, counted) and the new call takes its place. A call with no lower band to displace
  is refused (503 ``queue_full``).
- A call waiting longer than ``ttl`` leaves with 503 ``queue_timeout``.
- Released highest band first; within a band, by fair shares between tenants weighted by each
  call's estimated tokens (gateway.fair_share: start-time fair queuing on virtual token
  counters), oldest first among equal tags -- so one tenant's long generations cannot starve
  another's short ones.

Several gateway processes: ``per_band`` and ``total`` are fleet bounds, and each process holds
its share of them, ``QueuePolicy.share(n)`` with n = the live gateway processes (the holders
registered under a store lease, gateway.slots; read at most once a second). Each share is the
bound divided by n, rounded down and at least 1, so the processes together never hold more than
the bound (while n <= the bound) however the calls are spread, and displacement stays exact
and immediate: the call displaced is a connection this process holds. Why not one fleet-wide
queue: a higher-band call would then have to displace a call held by another process through
the store (a round trip, and a window where both admit), and admission would cost a store read
and write on every saturated call. The cost of the share: a process whose clients are many
more than the others' refuses while others have room, so spread clients evenly across gateways
(the gateways sit behind one address). docs/gateway.md, "Priority bands".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from common.errors import LimitExceeded
from gateway.fair_share import FairClock

BANDS = ("low", "normal", "high")  # lowest first
RANK = {b: i for i, b in enumerate(BANDS)}


class QueueRefused(LimitExceeded):
    """503 with Retry-After: queue_full, displaced or queue_timeout."""

    status = 503
    code = "queue_full"


@dataclass(frozen=True)
class QueuePolicy:
    per_band: int = 64
    total: int = 128
    ttl: float = 30.0
    release_per_tick: int = 4  # calls let go per tick (TICK s) while some pool has room

    def share(self, gateways: int) -> QueuePolicy:
        """This process's part of the fleet bounds when ``gateways`` processes are live."""
        n = max(1, gateways)
        if n == 1:
            return self
        return replace(self, per_band=max(1, self.per_band // n), total=max(1, self.total // n))


@dataclass(frozen=True)
class Queued:
    request_id: str
    band: str
    enqueued_at: float
    tenant: str | None = None
    start: float = 0.0  # virtual start and finish tags in the band (gateway.fair_share)
    finish: float = 0.0


@dataclass(frozen=True)
class EnqueueDecision:
    admitted: bool
    displaced: Queued | None = None
    reason: str = ""


def plan_enqueue(queued: Sequence[Queued], band: str, policy: QueuePolicy) -> EnqueueDecision:
    """Pure: may a call of ``band`` wait, and whom does it displace? ``queued`` in arrival order."""
    if sum(1 for q in queued if q.band == band) >= policy.per_band:
        return EnqueueDecision(False, reason=f"band {band} holds {policy.per_band} waiting calls")
    if len(queued) < policy.total:
        return EnqueueDecision(True)
    lower = [q for q in queued if RANK[q.band] < RANK[band]]
    if not lower:
        return EnqueueDecision(False, reason=f"{policy.total} calls wait and none is in a lower band")
    lowest = min(RANK[q.band] for q in lower)
    victim = [q for q in lower if RANK[q.band] == lowest][-1]  # the newest of the lowest band
    return EnqueueDecision(True, displaced=victim, reason=f"displaced the newest {victim.band} call")


def expired(queued: Sequence[Queued], policy: QueuePolicy, now: float) -> list[Queued]:
    """Pure: the calls that waited past the TTL."""
    return [q for q in queued if now - q.enqueued_at >= policy.ttl]


def release_order(queued: Sequence[Queued]) -> list[Queued]:
    """Pure: highest band first; within a band, lowest virtual start tag first (fair shares),
    then oldest (sort is stable on arrival order)."""
    return sorted(queued, key=lambda q: (-RANK[q.band], q.start))


TICK = 0.05


@dataclass
class _Endpoint:
    waiting: list[Queued] = field(default_factory=list)
    futures: dict[str, asyncio.Future] = field(default_factory=dict)
    pump: asyncio.Task | None = None
    clocks: dict[str, FairClock] = field(default_factory=dict)  # per band: tenants' virtual token counters


@dataclass
class WaitingRoom:
    """Per gateway process. ``has_room(endpoint)`` says whether some pool of the endpoint is no
    longer saturated (read from the cached view, so a tick costs no store call). ``gateways()``
    counts the live gateway processes (this one included): the room holds ``policy.share()``."""

    policy: QueuePolicy
    gateways: Callable[[], Awaitable[int]] | None = None
    on_displaced: Callable[[str], None] = lambda endpoint: None
    on_depth: Callable[[str, str, int], None] = lambda endpoint, band, n: None  # the waiting gauge
    _endpoints: dict[str, _Endpoint] = field(default_factory=dict)

    def depth(self, endpoint: str) -> dict[str, int]:
        ep = self._endpoints.get(endpoint)
        return {b: sum(1 for q in ep.waiting if q.band == b) if ep else 0 for b in BANDS}

    async def wait(self, endpoint: str, band: str, request_id: str,
                   has_room: Callable[[], Awaitable[bool]], tenant: str | None = None, cost: int = 0) -> float:
        """Wait until released (returns seconds waited) or raise QueueRefused (full, displaced,
        timed out). A caller that is cancelled leaves the queue. ``cost``: the call's estimated
        tokens, its tenant's share of the band is counted in (gateway.fair_share)."""
        policy = await self.current_policy()
        ep = self._endpoints.setdefault(endpoint, _Endpoint())
        decision = plan_enqueue(ep.waiting, band, policy)
        retry = max(1.0, self.policy.ttl / 4)
        if not decision.admitted:
            shared = "" if policy is self.policy else f"; this gateway's share of {self.policy.total}"
            raise QueueRefused(f"the endpoint is saturated and its queue is full ({decision.reason}{shared})",
                               retry_after=retry)
        if decision.displaced is not None:
            self._drop(ep, decision.displaced, QueueRefused(
                "displaced by a higher-priority call while the endpoint is saturated", retry_after=retry,
                code="displaced"))
            self.on_displaced(endpoint)
        t0 = time.monotonic()
        start, finish = ep.clocks.setdefault(band, FairClock()).stamp(tenant, cost)
        entry = Queued(request_id, band, t0, tenant, start, finish)
        fut = asyncio.get_running_loop().create_future()
        ep.waiting.append(entry)
        ep.futures[request_id] = fut
        self._report(endpoint, ep)
        if ep.pump is None or ep.pump.done():
            ep.pump = asyncio.create_task(self._pump(endpoint, ep, has_room))
        try:
            await fut
        finally:
            if request_id in ep.futures:  # cancelled while waiting
                self._drop(ep, entry, None)
            self._report(endpoint, ep)
        return time.monotonic() - t0

    async def current_policy(self) -> QueuePolicy:
        """The bounds this process applies now (its share of the fleet's)."""
        return self.policy.share(await self.gateways()) if self.gateways is not None else self.policy

    def _report(self, endpoint: str, ep: _Endpoint) -> None:
        for band in BANDS:
            self.on_depth(endpoint, band, sum(1 for q in ep.waiting if q.band == band))

    def _drop(self, ep: _Endpoint, entry: Queued, exc: BaseException | None, released: bool = False) -> None:
        ep.waiting = [q for q in ep.waiting if q.request_id != entry.request_id]
        clock = ep.clocks.get(entry.band)
        if clock is not None:
            if released:
                clock.released(entry.start)
            else:
                clock.withdrawn(entry.tenant, entry.start, entry.finish)
            if not any(q.band == entry.band for q in ep.waiting):
                clock.idle()
        fut = ep.futures.pop(entry.request_id, None)
        if fut is not None and not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    async def _pump(self, endpoint: str, ep: _Endpoint, has_room: Callable[[], Awaitable[bool]]) -> None:
        while ep.waiting:
            await asyncio.sleep(TICK)
            for q in expired(ep.waiting, self.policy, time.monotonic()):
                self._drop(ep, q, QueueRefused(f"waited {self.policy.ttl:g} s for a replica with room",
                                               retry_after=1.0, code="queue_timeout"))
            if ep.waiting and await has_room():
                for q in release_order(ep.waiting)[:self.policy.release_per_tick]:
                    self._drop(ep, q, None, released=True)
        if not ep.waiting and self._endpoints.get(endpoint) is ep:
            del self._endpoints[endpoint]
