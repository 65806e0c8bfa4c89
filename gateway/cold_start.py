"""Cold start: a call for an endpoint with no ready replica records demand, then waits or says so.

The autoscaler (fabricd, controlplane.scaling) scales a deployment parked at zero replicas back
to max(1, min_replicas) when it sees demand newer than its last change. The gateway records that
demand in the store under keyspace.demand(endpoint) as {"at": unix seconds} (at most one write
per endpoint per DEMAND_WRITE_GAP_S per process, and only for an endpoint that exists and a
caller that authenticated, so names an attacker invents never reach the store). Then:
  - FABRIC_GATEWAY_HOLD_SECS = 0 (default): answer 503 at once, with Retry-After and an
    OpenAI-style error body ("model_loading": the model is loading), which the official openai
    SDK retries by itself;
  - FABRIC_GATEWAY_HOLD_SECS > 0: hold the call, polling the endpoint's view, until a replica is
    Ready (the call then proceeds) or the hold expires (the same 503).
An endpoint whose replicas exist but none is ready (a replica restarting) gets the same answer:
from the caller's side it is the same wait.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common import keyspace
from common.errors import TransientError
from common.store.base import Store
from gateway.upstreams import EndpointView, UpstreamCache

RETRY_AFTER_S = 5.0
DEMAND_WRITE_GAP_S = 1.0
POLL_S = 0.5
DEMAND_MEMO_MAX = 10_000


class ModelLoading(TransientError):
    """503 with Retry-After: the endpoint has no ready replica yet."""

    code = "model_loading"

    def __init__(self, message: str, retry_after: float = RETRY_AFTER_S):
        super().__init__(message, delay=retry_after)
        self.retry_after = retry_after


@dataclass
class ColdStart:
    store: Store
    upstreams: UpstreamCache
    hold_secs: float = 0.0
    clock: Callable[[], float] = time.time
    _written: dict[str, float] = field(default_factory=dict)  # endpoint -> monotonic time of last write

    async def view(self, endpoint: str) -> EndpointView:
        """The endpoint's view once it has a ready replica; ModelLoading when none is ready
        (after holding up to hold_secs). NotFound and other errors pass through."""
        view = await self._ready_view(endpoint)
        if view is not None:
            return view
        await self.record_demand(endpoint)
        deadline = time.monotonic() + self.hold_secs
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(POLL_S, left))
            view = await self._ready_view(endpoint)
            if view is not None:
                return view
            await self.record_demand(endpoint)  # a long hold keeps the demand fresh
        raise ModelLoading(f"the model behind endpoint {endpoint!r} is loading (no replica is ready yet); "
                           f"retry in {RETRY_AFTER_S:g}s")

    async def _ready_view(self, endpoint: str) -> EndpointView | None:
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
        value = json.dumps({"at": self.clock()})
        await asyncio.to_thread(self.store.put, keyspace.demand(endpoint), value)
