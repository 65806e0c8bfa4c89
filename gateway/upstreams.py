"""Where a call goes: the endpoint's VIP and its ready replicas, read from the store and cached.

The store is the source of truth; a short TTL cache (default 1 s) keeps store round trips off
the hot path. Choosing and ordering targets, and shedding, are pure functions of that view.

Order: the VIP first when the endpoint has one; the session's replica (x-session-id, else the
first 64 prompt characters, hashed with rendezvous hashing so a replica set change moves few
sessions) right after it, or first when there is no VIP; then the other ready replicas, which
are only used for the single connect-failure retry.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

from common import keyspace
from common.errors import LimitExceeded, NotFound, TransientError
from common.schemas import InferenceEndpoint, Replica, ReplicaObservation
from common.store.base import Store

PRIORITY_FACTOR = {"low": 0.5, "normal": 1.0, "high": 2.0}


@dataclass(frozen=True)
class EndpointView:
    endpoint: InferenceEndpoint
    replicas: tuple[Replica, ...]  # ready, not draining, with an address
    queue_depths: dict[str, float]  # replica id -> last scraped queue depth (ok scrapes only)


def eligible(replicas: list[Replica]) -> tuple[Replica, ...]:
    return tuple(sorted((r for r in replicas if r.ready and not r.draining and r.host),
                        key=lambda r: r.replica_id))


def _score(session: str, replica_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{session}\0{replica_id}".encode(), digest_size=8).digest(), "big")


def order_targets(view: EndpointView, session: str | None, scheme: str = "http") -> list[str]:
    """Pure: base URLs to try, best first."""
    reps = list(view.replicas)
    if session and len(reps) > 1:
        reps.sort(key=lambda r: _score(session, r.replica_id), reverse=True)
    urls = [f"{scheme}://{_host(r.host)}:{r.port}" for r in reps]
    if view.endpoint.status.vip:
        urls.insert(0, f"{scheme}://{view.endpoint.status.vip}:{view.endpoint.port}")
    return urls


def _host(host: str | None) -> str:
    return f"[{host}]" if host and ":" in host else str(host)


def should_shed(view: EndpointView, threshold: float | None, priority: str) -> bool:
    """Pure: shed when every ready replica's queue is above the priority-scaled threshold.
    Replicas without a fresh observation count as not full (no data is not a reason to refuse)."""
    if not threshold or not view.replicas:
        return False
    limit = threshold * PRIORITY_FACTOR.get(priority, 1.0)
    return all(view.queue_depths.get(r.replica_id, 0.0) > limit for r in view.replicas)


def check_shed(view: EndpointView, threshold: float | None, priority: str) -> None:
    if should_shed(view, threshold, priority):
        raise LimitExceeded("every replica's queue is full; try again shortly", retry_after=1.0, code="overloaded")


def read_view(store: Store, name: str) -> EndpointView:
    kv = store.get(keyspace.endpoints(name))
    if kv is None:
        raise NotFound(f"endpoint {name!r} does not exist", code="endpoint_not_found")
    endpoint = InferenceEndpoint.model_validate_json(kv.value)
    replicas = [Replica.model_validate_json(r.value) for r in store.list(keyspace.replicas(endpoint.deployment))]
    ready = eligible(replicas)
    depths: dict[str, float] = {}
    for r in ready:
        ob = store.get(keyspace.observations(r.replica_id))
        if ob is not None:
            obs = ReplicaObservation.model_validate_json(ob.value)
            if obs.ok:
                depths[r.replica_id] = obs.queue_depth
    return EndpointView(endpoint, ready, depths)


@dataclass
class UpstreamCache:
    store: Store
    ttl_secs: float = 1.0
    _views: dict[str, tuple[float, EndpointView | None]] = field(default_factory=dict)
    _names: tuple[float, frozenset[str]] = (0.0, frozenset())

    async def view(self, name: str) -> EndpointView:
        now = time.monotonic()
        hit = self._views.get(name)
        if hit is None or hit[0] <= now:
            try:
                view: EndpointView | None = await asyncio.to_thread(read_view, self.store, name)
            except NotFound:
                view = None
            self._views[name] = hit = (now + self.ttl_secs, view)
        if hit[1] is None:
            raise NotFound(f"endpoint {name!r} does not exist", code="endpoint_not_found")
        if not hit[1].replicas and not hit[1].endpoint.status.vip:
            raise TransientError(f"endpoint {name!r} has no ready replica", code="no_ready_replica")
        return hit[1]

    async def known_models(self) -> frozenset[str]:
        """Model names in the catalogue, for metric labels (anything else is "unknown")."""
        now = time.monotonic()
        if self._names[0] <= now:
            kvs = await asyncio.to_thread(self.store.list, keyspace.models())
            self._names = (now + 10 * self.ttl_secs, frozenset(kv.key.rsplit("/", 1)[-1] for kv in kvs))
        return self._names[1]
