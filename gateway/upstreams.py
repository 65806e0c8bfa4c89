"""Where a call goes: the endpoint's VIP and its ready replicas, read from the store and cached.

The store is the source of truth; the gateway keeps a copy of the records views are made of,
listed once and then kept by its changes (UpstreamCache: at most 1 s old by default, O(changes) per
refresh), so store round trips stay off the hot path and a refresh never lists the fleet. Choosing and ordering targets, and shedding, are pure functions of that view.
A cached view's readings (queue depths, KV use) are looked up in the copy when they are used
(``LiveReadings``), so an agent's report, the common change, rebuilds no view.

Order: the VIP first when the endpoint has one; the session's replica (x-session-id, else the
first 64 prompt characters, hashed with rendezvous hashing so a replica set change moves few
sessions) right after it, or first when there is no VIP; then the other ready replicas, which
are only used for the single connect-failure retry.

Who gets calls is the endpoint's published routing plan (common.records.plans), the object the
routing controller pushes to the agents and explain shows: its routed replicas (Ready, not
draining, freshly scraped, on an allowed site, site_local's spill) and, for each spillover
deployment, the replicas it names. The gateway never re-derives that; it only drops at once a
replica whose record went draining or not Ready since the plan was made (the next plan leaves it
out too), so a new Ready replica reaches the gateway at the next routing tick, as it reaches the
Maglev map. An endpoint with no plan yet has no replica to call.

During a canary or blue/green share the plan's weights hash the sessions (weighted rendezvous
hashing), so calls that pick a replica directly (no VIP) follow the same split as the Maglev
table. A replica at weight 0 (the new set before its first step or switch, or during a
rollback) is never first, only a last retry.

Shedding refuses a call when ANY ready replica's queue is over the priority-scaled
FABRIC_SHED_QUEUE, counting only readings younger than MAX_READING_AGE (a stale or failed scrape
says nothing about the queue now).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from common import keyspace
from common.errors import LimitExceeded, NotFound, TransientError, UnreadableRecord
from common.records import deployments, endpoints, models, observations, plans, reading, replicas
from common.schemas import InferenceEndpoint, Replica, ReplicaObservation
from common.store.base import Store
from common.store.mirror import Mirror, Reads
from gateway.capacity import MAX_READING_AGE, Reading

PRIORITY_FACTOR = {"low": 0.5, "normal": 1.0, "high": 2.0}
VIEW_CACHE_MAX = 1024  # endpoint views cached (only endpoints that exist: a made-up name is never kept)


@dataclass(frozen=True)
class EndpointView:
    endpoint: InferenceEndpoint
    replicas: tuple[Replica, ...]  # ready, not draining, with an address
    queue_depths: Mapping[str, tuple[float, float]]  # replica id -> (queue depth, scraped_at), ok scrapes only
    weights: dict[str, float] = field(default_factory=dict)  # replica id -> rollout weight; empty: all equal
    readings: Mapping[str, Reading] = field(default_factory=dict)  # replica id -> queue, KV use (every pool)
    # (deployment, its eligible replicas) for the endpoint's spillover deployments, in order;
    # empty when it names none (the first pool is always deployment/replicas above).
    spill_pools: tuple[tuple[str, tuple[Replica, ...]], ...] = ()
    adapters: frozenset[str] = frozenset()  # the served model's LoRA adapters (gateway.adapters)
    max_adapters: int = 4  # loaded at once per replica

    @property
    def pools(self) -> list[tuple[str, tuple[Replica, ...]]]:
        return [(self.endpoint.deployment, self.replicas), *self.spill_pools]


def routable(replicas: list[Replica], routed: set[str]) -> tuple[Replica, ...]:
    """Pure: the plan's routed replicas whose records still say Ready, not draining, with an address."""
    return tuple(sorted((r for r in replicas if r.replica_id in routed and r.ready and not r.draining and r.host),
                        key=lambda r: r.replica_id))


def _score(session: str, replica_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{session}\0{replica_id}".encode(), digest_size=8).digest(), "big")


def _weighted_score(session: str, replica_id: str, weight: float) -> float:
    """Weighted rendezvous hashing: each replica wins sessions in proportion to its weight."""
    if weight <= 0:
        return -math.inf
    u = (_score(session, replica_id) + 0.5) / 2**64
    return -weight / math.log(u)


def order_targets(view: EndpointView, session: str | None, scheme: str = "http") -> list[str]:
    """Pure: base URLs to try, best first."""
    reps = list(view.replicas)
    if view.weights and len(reps) > 1:
        key = session or ""
        reps.sort(key=lambda r: _weighted_score(key, r.replica_id, view.weights.get(r.replica_id, 0.0)),
                  reverse=True)
    elif session and len(reps) > 1:
        reps.sort(key=lambda r: _score(session, r.replica_id), reverse=True)
    urls = [f"{scheme}://{_host(r.host)}:{r.port}" for r in reps]
    if view.endpoint.status.vip:
        urls.insert(0, f"{scheme}://{view.endpoint.status.vip}:{view.endpoint.port}")
    return urls


def replica_targets(view: EndpointView, first: str, scheme: str = "http") -> list[str]:
    """Pure: base URLs with the chosen replica first, then the others (the connect-failure
    retry); never the VIP, whose own hash would undo the choice."""
    reps = sorted(view.replicas, key=lambda r: r.replica_id != first)
    return [replica_target(r, scheme) for r in reps]


def replica_target(r: Replica, scheme: str = "http") -> str:
    return f"{scheme}://{_host(r.host)}:{r.port}"


def _host(host: str | None) -> str:
    return f"[{host}]" if host and ":" in host else str(host)


def should_shed(view: EndpointView, threshold: float | None, priority: str, now: float) -> bool:
    """Pure: shed when any ready replica's queue, read less than MAX_READING_AGE ago, is above
    the priority-scaled threshold."""
    if not threshold:
        return False
    limit = threshold * PRIORITY_FACTOR.get(priority, 1.0)
    for r in view.replicas:
        reading = view.queue_depths.get(r.replica_id)
        if reading is not None and now - reading[1] < MAX_READING_AGE and reading[0] > limit:
            return True
    return False


def check_shed(view: EndpointView, threshold: float | None, priority: str, now: float) -> None:
    if should_shed(view, threshold, priority, now):
        raise LimitExceeded("a replica's queue is over FABRIC_SHED_QUEUE; try again shortly", retry_after=1.0,
                            code="overloaded")


def read_view(store: Store, name: str, live: Mirror | None = None) -> EndpointView:
    """The endpoint's view, its readings read from ``store`` once; with ``live`` (the cache's
    Mirror), looked up in it at each use instead (``LiveReadings``)."""
    endpoint = endpoints.get(store, name)
    if endpoint is None:
        raise NotFound(f"endpoint {name!r} does not exist", code="endpoint_not_found")
    plan = plans.get(store, name)
    if plan is not None and plan.deployment != endpoint.deployment:
        plan = None  # a plan of the endpoint's earlier self: the next routing tick replaces it
    ready = _pool(store, endpoint.deployment, set(plan.routed()) if plan else set())
    pools = tuple((spilled.deployment, _pool(store, spilled.deployment, set(spilled.replicas)))
                  for spilled in (plan.spill if plan else []))
    weights = plan.gateway_weights() if plan else {}
    adapters, cap = _adapters(store, endpoint.deployment)
    view = EndpointView(endpoint, ready, {}, {r.replica_id: weights[r.replica_id] for r in ready
                                              if r.replica_id in weights}, {}, pools, adapters, cap)
    if live is not None:
        every = [r.replica_id for _, pool in view.pools for r in pool]
        return replace(view, queue_depths=LiveReadings(live, [r.replica_id for r in ready], 0),
                       readings=LiveReadings(live, every, 1))
    return with_readings(store, view)


def with_readings(store: Store, view: EndpointView) -> EndpointView:
    """The view with its replicas' queue depths (its own pool) and readings (every pool) read
    from ``store`` now; the rest of it as it was."""
    depths, readings = _readings(store, view.replicas)
    for _, pool in view.spill_pools:
        readings.update(_readings(store, pool)[1])
    return replace(view, queue_depths=depths, readings=readings)


class LiveReadings(Mapping):
    """Some replicas' readings as a Mirror holds them when asked: part 0 of each ok observation's
    ``decode_observation`` answer (queue depth, scraped_at) or part 1 (the Reading); a replica
    without one is absent. Parsed once per revision by the Mirror (its follower's thread, as the
    stream brings them), so a lookup is two dict reads and a view holding this is never rebuilt
    for a change of readings alone. Read on the Mirror's owner thread (the event loop)."""

    __slots__ = ("_mirror", "_ids", "_part")

    def __init__(self, mirror: Mirror, ids: list[str], part: int):
        self._mirror, self._ids, self._part = mirror, dict.fromkeys(ids), part  # ordered, O(1) `in`

    def _at(self, replica_id: str) -> object | None:
        got = self._mirror.decoded(keyspace.observations(replica_id))
        return None if got is None else got[self._part]  # type: ignore[index]  # decode_observation's pair

    def __getitem__(self, replica_id: str):
        got = self._at(replica_id) if replica_id in self._ids else None
        if got is None:
            raise KeyError(replica_id)
        return got

    def __iter__(self) -> Iterator[str]:
        return (r for r in self._ids if self._at(r) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"LiveReadings({dict(self)!r})"


def _adapters(store: Store, deployment: str) -> tuple[frozenset[str], int]:
    """The LoRA adapters of the deployment's model and how many a replica holds at once."""
    dep = deployments.get(store, deployment)
    m = models.get(store, dep.model) if dep else None
    if m is None:
        return frozenset(), 4
    return frozenset(a.name for a in m.adapters), m.max_loaded_adapters


def _pool(store: Store, deployment: str, routed: set[str]) -> tuple[Replica, ...]:
    """One deployment's replicas the plan routes calls to."""
    return routable(replicas.list(store, deployment), routed)


def _readings(store: Store, ready: tuple[Replica, ...]
              ) -> tuple[dict[str, tuple[float, float]], dict[str, Reading]]:
    """The replicas' queue depths and readings, from their ok observations."""
    depths: dict[str, tuple[float, float]] = {}
    readings: dict[str, Reading] = {}
    for r in ready:
        try:
            got = _reading_of(observations.get(store, r.replica_id))
        except UnreadableRecord:
            got = None  # a reading that does not parse says nothing about the queue now
        if got is not None:
            depths[r.replica_id], readings[r.replica_id] = got
    return depths, readings


def _reading_of(obs: ReplicaObservation | None) -> tuple[tuple[float, float], Reading] | None:
    """An ok observation's (queue depth, scraped_at) and reading; None: it says nothing."""
    if obs is None or not obs.ok:
        return None
    return (obs.queue_depth, obs.scraped_at), Reading(obs.queue_depth, obs.kv_cache_usage, obs.scraped_at)


def decode_observation(key: str, value: str) -> tuple[tuple[float, float], Reading] | None:
    """What a view reads of a stored observation (``_reading_of``), for the view cache's Mirror
    (Mirror.decoded): made in its follower's thread as agents report, so the event loop only
    looks it up; None when it does not parse or is not ok (it says nothing then)."""
    try:
        return _reading_of(reading.parse(ReplicaObservation, value))
    except ValueError:  # pydantic's ValidationError is a ValueError
        return None


def _view_or_none(store: Store, name: str, live: Mirror) -> EndpointView | None:
    try:
        return read_view(store, name, live)
    except NotFound:
        return None


def _model_names(store: Store) -> frozenset[str]:
    return frozenset(m.name for m in models.list(store))


READINGS_CONFIRM_EVERY = 10  # refreshes (TTLs) between two confirmations of the streamed readings
# What a view reads: listed once by the gateway's Mirror, then only their changes.
VIEW_PREFIXES = (keyspace.endpoints(), keyspace.routing_plans(), keyspace.replicas(), keyspace.observations(),
                 keyspace.deployments(), keyspace.models())


@dataclass
class UpstreamCache:
    """Endpoint views read from a Mirror of the records they are made of (common.store.mirror).

    The mirror is brought up to date at most every ``ttl_secs`` (one read of the changes per
    prefix, in the thread pool, never on a call's path once warm: past half the TTL the first call starts the
    fetch and goes on with the copy it has; only a copy older than the TTL is waited for). A view
    is rebuilt only when a key or prefix it was built from changed, so a refresh costs
    O(changes), never a list of every replica."""

    store: Store
    ttl_secs: float = 1.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        # observations, which change most (every agent's report), streamed between fetches and
        # parsed as they come; one watch of the prefix (the gateway's etcd role cannot watch all
        # of /fabric/: common.store.etcd_auth)
        # The readings are advisory (scraped up to a report period ago): between confirmations,
        # every READINGS_CONFIRM_EVERY refreshes, the stream alone brings them (Mirror's trust);
        # every other record is confirmed against the store at each refresh.
        self.mirror = Mirror(self.store, list(VIEW_PREFIXES), follow=[keyspace.observations()],
                             decode={keyspace.observations(): decode_observation},
                             trust={keyspace.observations(): READINGS_CONFIRM_EVERY * self.ttl_secs},
                             clock=self.clock)
        # name -> view, what it was made of (its readings aside), at version
        self._views: dict[str, tuple[EndpointView | None, Reads, int]] = {}
        self._synced = -math.inf  # clock() when the last applied fetch started
        self._fetching: asyncio.Future | None = None
        self._started = 0  # fetches started, numbered from 1
        self._applied = 0  # the number of the latest fetch applied
        self.views_built = 0  # tests and benchmarks read it

    def readings_age(self) -> float | None:
        """Seconds since the readings were last confirmed against the store (None: not yet)."""
        at = self.mirror.confirmed_at(keyspace.observations())
        return None if at == -math.inf else self.clock() - at

    async def refresh(self) -> None:
        """The mirror no older than the TTL (see the class docstring)."""
        now = self.clock()
        age = now - self._synced
        if age < self.ttl_secs:
            if age >= self.ttl_secs / 2 and self._fetching is None:
                self._start(now)  # refresh ahead: nobody waits for it
            return
        if self._fetching is None:
            self._start(now)
        assert self._fetching is not None
        # shielded: a caller that is cancelled (its client left) must not cancel the shared fetch
        await asyncio.shield(self._fetching)

    def _start(self, now: float) -> None:
        """One fetch; never while another is in flight (callers join ``_fetching`` instead)."""
        assert self._fetching is None
        self._started += 1
        fetching = asyncio.ensure_future(self._fetch(now, self._started))
        fetching.add_done_callback(lambda t: t.cancelled() or t.exception())  # never "never retrieved"
        self._fetching = fetching

    async def _fetch(self, now: float, number: int) -> None:
        """The fetch in the thread pool, applied by this task before it ends: a caller that finds
        ``_fetching`` done finds its copy applied. (Applying in a done-callback left a window --
        the executor's future done, the callback not yet run -- in which ``_caught_up`` awaited a
        done future, which returns without yielding, and spun on the event loop forever.)"""
        try:
            fetched = await asyncio.get_running_loop().run_in_executor(None, self.mirror.fetch)
        finally:
            self._fetching = None  # an error reaches the waiters; the copy stays until past the TTL
        self.mirror.apply(fetched)
        self._synced = now  # counted from the fetch's start: never older than that
        self._applied = number

    def _view_now(self, name: str) -> EndpointView | None:
        """The cached view while nothing it was made of changed, else built anew. Its readings
        are the copy's at each use (``LiveReadings``): a change of observations alone, an
        agent's report, rebuilds nothing."""
        cached = self._views.get(name)
        if cached is not None and not self.mirror.moved(cached[1], cached[2]):
            return cached[0]
        reader, reads = self.mirror.tracked()
        view = _view_or_none(reader, name, self.mirror)  # type: ignore[arg-type]  # the Store read verbs
        self.views_built += 1
        if view is None:  # a name with no endpoint is one lookup in the copy: never kept, so a
            self._views.pop(name, None)  # flood of made-up names neither grows nor empties the cache
            return None
        if cached is None and len(self._views) >= VIEW_CACHE_MAX:
            self._views.clear()  # crude bound: past this many endpoints memory still cannot grow
        self._views[name] = (view, reads, self.mirror.version)
        return view

    async def view(self, name: str, need_upstream: bool = True) -> EndpointView:
        """need_upstream=False (dry run): the endpoint must exist, replicas need not."""
        arrived = self._started  # the fetches started before this call
        await self.refresh()
        view = self._view_now(name)
        if view is None:  # perhaps created since the copy was made: catch up, then look again
            await self._caught_up(arrived)
            view = self._view_now(name)
        if view is None:
            raise NotFound(f"endpoint {name!r} does not exist", code="endpoint_not_found")
        ep = view.endpoint
        if ep.status.phase == "Deleting":  # its VIP drains the calls in flight; no new ones
            raise NotFound(f"endpoint {name!r} is being deleted", code="endpoint_not_found")
        if need_upstream and not view.replicas and not ep.status.vip and ep.external is None \
                and not ep.spillover and not ep.fallbacks:
            raise TransientError(f"endpoint {name!r} has no ready replica", code="no_ready_replica")
        return view

    async def _caught_up(self, after: int) -> None:
        """The copy holds every write made before this call: a fetch that started after it was
        applied. The fetch is shared by every caller waiting at the same time and only one runs at
        once, so a flood of names the copy does not know (made up, or created since) costs the
        store one fetch at a time -- a revision read when nothing changed -- never a read per
        call; a new endpoint still answers from its first call. ``after``: the fetches started
        before the call (one the call's own refresh started counts)."""
        while self._applied <= after:
            if self._fetching is None:
                self._start(self.clock())
            assert self._fetching is not None
            await asyncio.shield(self._fetching)

    async def known_models(self) -> frozenset[str]:
        """Model names in the catalogue, for metric labels (anything else is "unknown")."""
        await self.refresh()
        return _model_names(self.mirror)  # type: ignore[arg-type]  # the Store read verbs

    def close(self) -> None:
        self.mirror.close()
