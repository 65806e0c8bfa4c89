"""The scale rig behind scripts/bench-scale: the project's own loops on a simulated fleet.

A fleet is ``nodes`` x ``per_node`` Ready replicas spread over ``endpoints`` endpoints (one
deployment each, replica i in deployment i mod D, on node i // per_node; D is E, or more where E
deployments would each pass the 64 replicas a deployment may have: the extra ones have no
endpoint, their replicas are still scraped and probed), written to a real store
(SQLite, or a real etcd from lab.rigs.etcd_server, secured as in production). Engines are one
helper process serving a 50 KB vLLM page per replica port (lab.rigs.sim_engines, "quiet": frozen
until made busy); agents are one helper process with a port per node (lab.rigs.sim_agents),
counting what they are sent; one of them may be silent. The leader's loops are the real ones:
controlplane.routing.controller.RoutingWorker (with its AgentClients over HTTP on loopback),
controlplane.reconcile.apply.ReconcileWorker, and a gateway's view refresh (gateway.upstreams
UpstreamCache: its mirror of the store brought up to date and every endpoint's view asked).

Each measured pass records (``Figures``): the leader process's CPU-seconds (time.process_time:
every thread of this process, so work moved off the event loop still counts), wall seconds, the
longest stretch the event loop did not yield (a task sleeping 10 ms records how late it woke),
store write and read calls, connections the leader opened to engines and to agents, requests
engines answered, push requests and services agents received, endpoints whose plan generation
moved and replicas whose observation was rewritten. Between passes (``Fleet.between_passes``,
not measured) engines and agents drop idle kept-alive connections, as their 5 s keep-alive
timeout does within fabricd's 10 s and 15 s periods, and every agent heartbeats with the service
generations it holds, as agents do every 10 s.

Routing passes, in order: ``first`` (everything new), ``second`` (the first rates appear),
``idle`` (nothing moved), ``change`` (the
queue of one replica in each of ``changed`` endpoints rises), ``busy`` (every engine's counters
move: every observation changes, the worst case). Reconcile: ``first`` and ``steady``. Gateway:
``first`` (its mirror lists the store), ``refresh`` (between passes every agent heartbeats, and
with agents observing re-reports every observation: the mirror follows those changes) and
``steady`` (right after 1/30 of the observations were rewritten, what a steady fleet re-sends at
the 15 s age within one 0.5 s period: ``Fleet.touch_observations``).

Agents that observe their engines (issue 49 item 3, ``Size.agents_observe``): between passes
(not measured) every node's agent scrapes and probes its replicas with the agent's own observer
(common.engine_metrics, health on), its materially changed observations are stored through
fabricd's own report handler (controlplane.ops.nodes.report_observations: one batch per agent)
and its heartbeat names them (Node.observed_replicas); the leader then reads them from the store
and opens no connection per replica. ``reported_observations`` counts what those reports stored
before a pass.

Balancer nodes (issue 49 item 1): ``balancers`` gives the first N nodes ``Node.balancer`` (None:
every node); only balancers get the pushed services.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent.engine_watch import compact, report_body
from common import keyspace
from common.agent_api import ObservationReport, ObservedReplica
from common.engine_metrics.material import material_change
from common.engine_metrics.observer import EngineObserver, EngineTarget
from common.engine_metrics.scrape import MetricsScraper
from common.records import observations, plans
from common.schemas import (
    GpuInfo,
    GpuRequest,
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    ModelArtifact,
    Node,
    Replica,
    ReplicaObservation,
)
from common.store.base import Store
from common.store.mirror import Mirror
from controlplane.agent_client import AgentClients
from controlplane.ops.nodes import report_observations
from controlplane.placement import vip_pool
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from controlplane.routing.controller import RoutingWorker
from gateway.upstreams import READINGS_CONFIRM_EVERY, UpstreamCache
from lab.rigs.loopback_http import raise_fd_limit
from lab.rigs.sim_agents import SimAgents
from lab.rigs.sim_engines import SimEngines

WRITES = frozenset({"put", "create", "cas", "create_all", "put_all", "delete", "delete_prefix"})
BATCHES = frozenset({"create_all", "put_all"})
READS = frozenset({"get", "get_all", "list", "revision", "changed_since", "watch"})
SETUP_BATCH = 50  # records per create_all at setup (etcd's default --max-txn-ops is 128)
LAG_TICK_S = 0.01
MAX_DEPLOYMENT_REPLICAS = next(m.le for m in InferenceDeployment.model_fields["replicas"].metadata if hasattr(m, "le"))


class CountingStore:
    """A Store that counts the calls made through it: writes by kind of record, reads."""

    def __init__(self, inner: Store):
        self.inner = inner
        self.writes = 0
        self.reads = 0
        self.written: dict[str, int] = {}  # /fabric/<kind>/ -> write calls ("batch": create_all, put_all)
        self.items: dict[str, int] = {}  # /fabric/<kind>/ -> keys written, in batches or alone
        self.calls: dict[str, int] = {}  # read verb -> calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in WRITES:
            def counted(key, *args, **kwargs):
                self.writes += 1
                kind = "batch" if name in BATCHES else key.split("/")[2]
                self.written[kind] = self.written.get(kind, 0) + 1
                for k in ([k for k, _ in key] if name in BATCHES else [key]):
                    self.items[k.split("/")[2]] = self.items.get(k.split("/")[2], 0) + 1
                return attr(key, *args, **kwargs)
            return counted
        if name in READS:
            def read(*args, **kwargs):
                self.reads += 1
                self.calls[name] = self.calls.get(name, 0) + 1
                return attr(*args, **kwargs)
            return read
        return attr


class LagProbe:
    """The longest the event loop went without running a task due every 10 ms, and where it was:
    while the loop is late by more than STALL_SAMPLE_S, a watcher thread samples its stack every
    STALL_SAMPLE_S and counts the project frames it finds (``where``: "file:function" chains,
    innermost first; each sample stands for about STALL_SAMPLE_S of stall)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.where: Counter[str] = Counter()
        self._task: asyncio.Task | None = None
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            self._beat = time.monotonic()
            await asyncio.sleep(LAG_TICK_S)
            self.worst = max(self.worst, loop.time() - t0 - LAG_TICK_S)

    def _watch(self, thread_id: int) -> None:
        while not self._stop.wait(STALL_SAMPLE_S):
            if time.monotonic() - self._beat > STALL_SAMPLE_S + LAG_TICK_S:
                frame = sys._current_frames().get(thread_id)
                if frame is not None:
                    self.where[_project_frames(frame)] += 1

    def top(self, n: int = 5) -> list[dict]:
        return [{"frames": k, "samples": v} for k, v in self.where.most_common(n)]

    def __enter__(self) -> LagProbe:
        self.worst = 0.0
        self.where.clear()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._stop.clear()
        self._watcher = threading.Thread(target=self._watch, args=(threading.get_ident(),), daemon=True,
                                         name="lag-probe")
        self._watcher.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._task is not None and self._watcher is not None
        self._task.cancel()
        self._stop.set()
        self._watcher.join()


STALL_SAMPLE_S = 0.02
_ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def _project_frames(frame, depth: int = 4) -> str:
    """The innermost ``depth`` frames of this project's code (not its venv) on a stack."""
    out: list[str] = []
    while frame is not None and len(out) < depth:
        name = frame.f_code.co_filename
        if name.startswith(_ROOT) and "/.venv/" not in name:
            out.append(f"{name[len(_ROOT):]}:{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(out) or "outside the project's code"


@dataclass
class Figures:
    cpu_s: float = 0.0
    wall_s: float = 0.0
    max_stall_s: float = 0.0
    stall_where: list[dict] = field(default_factory=list)  # LagProbe.top(): where the loop was while late
    store_writes: int = 0
    store_reads: int = 0
    writes_by_kind: dict[str, int] = field(default_factory=dict)
    engine_connections: int = 0
    engine_requests: int = 0
    agent_connections: int = 0
    push_requests: int = 0
    push_services: int = 0
    agent_calls: dict[str, int] = field(default_factory=dict)
    changed_endpoints: int = 0
    observations_written: int = 0
    agents_pushed: int = 0  # agents that received at least one request in the pass
    waited_silent: bool = False  # the pass waited for the silent agent's answer
    reported_observations: int = 0  # stored from the agents' reports before the pass (agents_observe)
    agents_tick_s: float = 0.0  # the rig's one-process scrape of every engine before the pass (agents_observe)
    replicas_changed: int = 0  # replicas whose load the rig changed before the pass (the change pass)
    report_bytes: int = 0  # the agents' reports before the pass, gzip, as their POSTs carry them (agents_observe)

    def rounded(self) -> dict:
        out = asdict(self)
        for k in ("cpu_s", "wall_s", "max_stall_s"):
            out[k] = round(out[k], 4)
        return out


@dataclass(frozen=True)
class Size:
    nodes: int
    endpoints: int
    per_node: int = 8
    balancers: int | None = None  # the first N nodes have the balancer role; None: every node
    silent_agent: bool = False
    changed: int = 0  # endpoints whose replica's queue rises in the change pass; 0: max(1, E // 10)
    agents_observe: bool = False  # every agent scrapes and probes its engines and reports (AgentReports)

    @property
    def replicas(self) -> int:
        return self.nodes * self.per_node

    @property
    def deployments(self) -> int:
        """One per endpoint, and more (without an endpoint) where an endpoint's share of the replicas
        would pass a deployment's most (MAX_DEPLOYMENT_REPLICAS)."""
        return max(self.endpoints, -(-self.replicas // MAX_DEPLOYMENT_REPLICAS))

    @property
    def changed_endpoints(self) -> int:
        return min(self.changed or max(1, self.endpoints // 10), self.endpoints, self.replicas)


class AgentReports:
    """What every node's agent does for its engines between passes (agent.engine_watch): scrape and
    probe them (one observer for the fleet, on its own thread and event loop, as the agent's watch
    runs), report the materially changed observations through fabricd's report handler, and name
    the reported replicas in the heartbeat (``observed``)."""

    def __init__(self, store: Store, targets: dict[str, list[EngineTarget]]):
        self.store = store
        self.targets = targets  # node id -> its replicas' engines
        self.observer = EngineObserver(MetricsScraper(concurrency=64), health=True)
        self.reported: dict[str, ReplicaObservation] = {}
        self.observed: dict[str, list[str]] = {n: [] for n in targets}
        self.tick_s = 0.0  # the last tick's scrape of every engine, in this one process
        self.wire_bytes = 0  # the reports' bodies as the agents send them (gzip), since the start
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sim-agent-reports")
        self._loop = asyncio.new_event_loop()

    def report(self) -> int:
        """One tick of every agent; the observations fabricd stored."""
        found = [t for ts in self.targets.values() for t in ts]
        t0 = time.perf_counter()
        seen = self._pool.submit(self._loop.run_until_complete, self.observer.observe_all(found)).result()
        self.tick_s = time.perf_counter() - t0
        stored, ctx = 0, SimpleNamespace(store=self.store)
        seen_by = dict(zip((t.replica_id for t in found), seen))
        for node_id, ts in self.targets.items():
            # Each agent's observations carry the moment it reports them as their scrape time: a
            # fleet's agents each scrape their own few engines and report at once, where this one
            # process scrapes them all and then stores the reports one node after another (at 1,000
            # nodes for longer than the 30 s eligibility window, which would age the first nodes'
            # reports out before the pass and fail every health they carry).
            now = time.time()
            fresh = {t.replica_id: seen_by[t.replica_id].model_copy(update={"scraped_at": now}) for t in ts}
            items = [compact(ObservedReplica(**fresh[t.replica_id].model_dump(), deployment=t.deployment)) for t in ts
                     if material_change(self.reported.get(t.replica_id), fresh[t.replica_id])]
            if items:
                self.wire_bytes += len(report_body(items, now))  # what the agent's POST would carry
                stored += report_observations(ctx, node_id, ObservationReport(sent_at=now, observations=items),
                                              now).accepted
            self.reported.update({i.replica_id: i.record() for i in items})
            self.observed[node_id] = sorted(t.replica_id for t in ts if t.replica_id in self.reported)
        return stored

    def close(self) -> None:
        self._pool.submit(self._loop.run_until_complete, self.observer.aclose()).result()
        self._pool.submit(self._loop.close).result()
        self._pool.shutdown()


class Fleet:
    """The records, engines and agents of one Size on one store (a context manager)."""

    def __init__(self, store: Store, size: Size):
        self.raw = store
        self.size = size
        self.store = CountingStore(store)
        self._stack = ExitStack()
        self.engines: SimEngines
        self.agents: SimAgents
        self.reports: AgentReports | None = None  # the agents' engine reports (Size.agents_observe)
        self.changed_replicas = 0  # set by change_queues, counted by the next measure

    def __enter__(self) -> Fleet:
        raise_fd_limit()
        self.engines = self._stack.enter_context(SimEngines(self.size.replicas, "quiet"))
        self.agents = self._stack.enter_context(SimAgents(self.size.nodes, frozenset({0} if self.size.silent_agent
                                                                                     else ())))
        self.engine_ports, self.agent_ports = self.engines.ports, self.agents.ports  # agent_ports[0]: control
        try:
            self._write_records()
            if self.size.agents_observe:
                self.reports = AgentReports(self.raw, self._engine_targets())
                self._stack.callback(self.reports.close)
        except BaseException:
            self._stack.close()  # __exit__ is not called when __enter__ fails: stop the helpers here
            raise
        return self

    def _engine_targets(self) -> dict[str, list[EngineTarget]]:
        out: dict[str, list[EngineTarget]] = {n.id: [] for n in self.nodes}
        for i, port in enumerate(self.engine_ports):
            d = self.deployment_of(i)
            out[f"n{i // self.size.per_node:04d}"].append(EngineTarget(f"{d}-{i}", "127.0.0.1", port, "vllm", d))
        return out

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def deployment_of(self, i: int) -> str:
        return f"d{i % self.size.deployments:04d}"

    def _write_records(self) -> None:
        s, now = self.size, time.time()
        gpus = [GpuInfo(index=g, uuid=f"g{g}", name="NVIDIA H100", pci=f"0000:{0x10 + g:02x}:00.0",
                        memory_total_mib=81920) for g in range(s.per_node)]
        items = [(keyspace.models("m"), ModelArtifact(name="m", source="hf://org/m").model_dump_json()),
                 (keyspace.profiles("p"), InferenceProfile(name="p", gpu=GpuRequest(count=1, vram_gib=40), cpu=4,
                                                           memory_gib=16).model_dump_json())]
        self.nodes = [Node(id=f"n{n:04d}", address=f"http://127.0.0.1:{self.agent_ports[n + 1]}", gpus=gpus,
                           cpu_free=128, memory_free_gib=1024, last_heartbeat=now,
                           balancer=s.balancers is None or n < s.balancers)
                      for n in range(s.nodes)]
        items += [(keyspace.nodes(n.id), n.model_dump_json()) for n in self.nodes]
        counts = [0] * s.deployments
        for i in range(s.replicas):
            counts[i % s.deployments] += 1
        for e in range(s.deployments):
            d = f"d{e:04d}"
            items.append((keyspace.deployments(d), InferenceDeployment(name=d, model="m", profile="p",
                                                                       replicas=counts[e]).model_dump_json()))
        for e in range(s.endpoints):
            items.append((keyspace.endpoints(f"e{e:04d}"), InferenceEndpoint(
                name=f"e{e:04d}", deployment=f"d{e:04d}", routing="least_queue").model_dump_json()))
        for i, port in enumerate(self.engine_ports):
            d, node = self.deployment_of(i), i // s.per_node
            r = Replica(replica_id=f"{d}-{i}", deployment=d, ordinal=i // s.deployments, node=f"n{node:04d}",
                        gpus=[gpus[i % s.per_node].pci], host="127.0.0.1", port=port, phase="Ready", ready=True,
                        ready_since=now - 60)
            items.append((keyspace.replicas(d, r.replica_id), r.model_dump_json()))
        for k in range(0, len(items), SETUP_BATCH):
            assert self.raw.create_all(items[k:k + SETUP_BATCH]), "the store already holds this fleet"

    def between_passes(self) -> int:
        """What happens in the period between two passes, outside the measurement: the agents that
        observe their engines report them (``AgentReports``), the engines' and agents' keep-alive
        timeouts close idle connections, and every agent heartbeats (through fabricd's API, not the
        leader's loops) with the service generations it holds and the replicas it observes. Returns
        the observations the agents' reports stored."""
        reported = self.reports.report() if self.reports is not None else 0
        self.engines.drop_idle()
        self.agents.drop_idle()
        held, now = self.agents.held(), time.time()
        for n, port in zip(self.nodes, self.agent_ports[1:]):
            self.raw.put(keyspace.nodes(n.id), n.model_copy(update={
                "last_heartbeat": now, "service_generations": held.get(port, {}),
                "observed_replicas": self.reports.observed[n.id] if self.reports is not None else []},
            ).model_dump_json())
        return reported

    def change_queues(self, waiting: int) -> None:
        """The first replica of each of the first ``changed_endpoints`` endpoints gets ``waiting`` queued."""
        for i in range(self.size.changed_endpoints):
            self.engines.set_load(self.engine_ports[i], waiting)
        self.changed_replicas = self.size.changed_endpoints

    def touch_observations(self, count: int) -> int:
        """Rewrite ``count`` stored observations (spread over the fleet), queue one higher: what one
        gateway refresh period (0.5 s) of a steady fleet's reports holds. Returns how many."""
        kvs = self.raw.list(keyspace.observations())
        step = max(1, len(kvs) // max(1, count))
        batch = [ReplicaObservation.model_validate_json(kv.value) for kv in kvs[::step][:count]]
        observations.put_all(self.raw, [o.model_copy(update={"queue_depth": o.queue_depth + 1,
                                                             "scraped_at": time.time()}) for o in batch])
        return len(batch)

    async def measure(self, run: Callable[[], Awaitable[None]], routing: RoutingWorker | None = None,
                      between: bool = True, settle: Callable[[], None] | None = None) -> Figures:
        """``between``: the period between passes happens first (Fleet.between_passes); False
        measures right after whatever the caller changed. ``settle``: called last before the
        pass, outside the measurement."""
        wire0 = self.reports.wire_bytes if self.reports is not None else 0
        reported = self.between_passes() if between else 0
        if settle is not None:
            settle()
        wire = (self.reports.wire_bytes if self.reports is not None else 0) - wire0
        changed, self.changed_replicas = self.changed_replicas, 0
        before_plans = {p.endpoint: p.generation for p in plans.list(self.raw)}
        eng0, ag0 = self.engines.stats(), self.agents.stats()
        w0, r0, kinds0, items0 = self.store.writes, self.store.reads, dict(self.store.written), dict(self.store.items)
        silent_node = "n0000" if self.size.silent_agent else None
        with LagProbe() as lag:
            c0, t0 = time.process_time(), time.perf_counter()
            await run()
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        eng1, ag1 = self.engines.stats(), self.agents.stats()
        after_plans = {p.endpoint: p.generation for p in plans.list(self.raw)}
        kinds = {k: v - kinds0.get(k, 0) for k, v in self.store.written.items() if v != kinds0.get(k, 0)}
        return Figures(
            cpu_s=cpu, wall_s=wall, max_stall_s=lag.worst, stall_where=lag.top(), store_writes=self.store.writes - w0,
            store_reads=self.store.reads - r0, writes_by_kind=kinds,
            engine_connections=eng1["connections"] - eng0["connections"],
            engine_requests=(eng1["metrics"] + eng1["health"]) - (eng0["metrics"] + eng0["health"]),
            agent_connections=ag1["connections"] - ag0["connections"],
            push_requests=ag1["calls"].get("PUT /v1/maglev/services", 0) - ag0["calls"].get(
                "PUT /v1/maglev/services", 0),
            push_services=ag1["services"] - ag0["services"],
            agent_calls={k: v - ag0["calls"].get(k, 0) for k, v in ag1["calls"].items()
                         if v != ag0["calls"].get(k, 0)},
            changed_endpoints=sum(1 for e, g in after_plans.items() if before_plans.get(e) != g),
            observations_written=self.store.items.get("observations", 0) - items0.get("observations", 0),
            agents_pushed=sum(1 for p, n in ag1["per_agent"].items() if n != ag0["per_agent"].get(p, 0)),
            waited_silent=bool(routing is not None and silent_node in routing.pushes.waited),
            reported_observations=reported, replicas_changed=changed, report_bytes=wire,
            agents_tick_s=round(self.reports.tick_s, 2) if self.reports is not None else 0.0)


async def gateway_refresh(cache: UpstreamCache, clock: list[float], endpoints: list[str]) -> None:
    """What one gateway's view cache does per refresh period: its mirror brought up to date once
    (a list of every prefix the first time, the changes since after that) and every endpoint's
    view asked, each rebuilt only if what it was made of changed. ``clock`` is the cache's: it
    moves one TTL here, so the first view fetches and the others read the copy, as calls within
    one period do."""
    clock[0] += cache.ttl_secs
    for name in endpoints:
        await cache.view(name, need_upstream=False)


def streamed(store: Store, mirror: Mirror, span: str, prefixes: Iterable[str], timeout_s: float = 60.0) -> None:
    """Wait until ``mirror``'s stream of ``span`` has brought the last key written under
    ``prefixes`` (none open yet, before the mirror's first fetch: nothing to wait for). What a
    loop meets between its passes in a deployment, where the period (0.5 s to 15 s) leaves the
    stream time to catch up: the rig's passes follow one another at once."""
    if mirror.stream_reached(span) is None:
        return
    last = max((kv.mod_revision for p in prefixes for kv in store.list(p)), default=0)
    deadline = time.monotonic() + timeout_s
    while (mirror.stream_reached(span) or 0) < last:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the stream of {span} did not reach revision {last} in {timeout_s:.0f}s")
        time.sleep(0.01)


async def run_loops(fleet: Fleet, state_dir: Path, push_deadline_s: float) -> dict:
    """Every measured pass of the rig on ``fleet`` (see the module docstring)."""
    agents = AgentClients(state_dir, insecure=True)
    routing = RoutingWorker(fleet.store, agents, vip_pool.parse_pool("10.96.0.0/20"),
                            push_deadline_s=push_deadline_s)
    reconcile = ReconcileWorker(fleet.store, agents, rp.ReconcileSettings())
    out: dict[str, dict] = {"routing": {}, "reconcile": {}, "gateway": {}}
    closing = AsyncExitStack()  # the leader's workers: closed once, when done or on a failure
    closing.push_async_callback(reconcile.aclose)
    closing.push_async_callback(routing.aclose)

    def routing_pass() -> Awaitable[Figures]:
        return fleet.measure(routing.tick, routing, settle=lambda: streamed(
            fleet.raw, routing.mirror, keyspace.ROOT + "/", routing.mirror.prefixes))

    try:
        out["routing"]["first"] = (await routing_pass()).rounded()
        # The second scrape gives every replica its first rates: each observation is written again.
        out["routing"]["second"] = (await routing_pass()).rounded()
        out["routing"]["idle"] = (await routing_pass()).rounded()
        fleet.change_queues(8)
        out["routing"]["change"] = (await routing_pass()).rounded()
        fleet.engines.set_busy(True)
        out["routing"]["busy"] = (await routing_pass()).rounded()
        fleet.engines.set_busy(False)
        out["routing"]["mirror_prefixes"] = len(routing.mirror.prefixes)
        out["reconcile"]["first"] = (await fleet.measure(reconcile.tick)).rounded()
        out["reconcile"]["steady"] = (await fleet.measure(reconcile.tick)).rounded()
        # The leader's loops are done: its workers stop before the gateway's refreshes, as a
        # gateway runs in its own process (the routing mirror's stream of /fabric/ would
        # otherwise take every report of the period in this process while a refresh is timed).
        await closing.aclose()
        names = [f"e{e:04d}" for e in range(fleet.size.endpoints)]
        gw = CountingStore(fleet.raw)
        clock = [0.0]
        cache = UpstreamCache(gw, ttl_secs=1.0, clock=lambda: clock[0])
        span = keyspace.observations()

        def settle() -> None:
            streamed(fleet.raw, cache.mirror, span, [span])

        try:
            # the first lists, the second follows a period between passes (with agents observing,
            # every observation re-reported), the third one refresh period of a steady fleet: the
            # observations re-sent at the 15 s age within 0.5 s (1/30 of them), nothing between;
            # "confirmed" is "refresh" once the readings' trust ran out (every READINGS_CONFIRM_EVERY
            # refreshes: the readings asked of the store, not only taken from the stream). Each
            # refresh comes once the gateway's stream brought the observations written before it,
            # as the reports of a period reach a gateway's stream well before its next refresh.
            for label in ("first", "refresh", "steady", "confirmed"):
                touched = fleet.touch_observations(-(-fleet.size.replicas // 30)) if label == "steady" else 0
                if label == "confirmed":
                    clock[0] += READINGS_CONFIRM_EVERY * cache.ttl_secs
                reads0, built0, pre0 = gw.reads, cache.views_built, cache.mirror.prefetched
                out["gateway"][label] = (await fleet.measure(lambda: gateway_refresh(cache, clock, names),
                                                             between=label != "steady", settle=settle)).rounded()
                out["gateway"][label]["store_reads"] = gw.reads - reads0
                out["gateway"][label]["views_built"] = cache.views_built - built0
                out["gateway"][label]["streamed"] = cache.mirror.prefetched - pre0  # changes the stream brought
                out["gateway"][label]["observations_touched"] = touched
        finally:
            cache.close()
    finally:
        await closing.aclose()
        await agents.aclose()
    return out


def run_size(size: Size, store_kind: str, *, etcd=None, push_deadline_s: float = 5.0) -> dict:
    """One fleet on a fresh store: ``store_kind`` "sqlite", or "etcd" on the running ``etcd``
    server (its keys are removed first). The figures of every pass, by loop."""
    from common.store.sqlite_store import SqliteStore

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        if store_kind == "sqlite":
            store: Store = SqliteStore(Path(tmp) / "fabric.db")
        else:
            store = etcd.open()
            store.delete_prefix(keyspace.ROOT + "/")
        try:
            t0 = time.perf_counter()
            with Fleet(store, size) as fleet:
                setup_s = time.perf_counter() - t0
                out = asyncio.run(run_loops(fleet, Path(tmp), push_deadline_s))
        finally:
            store.close()
    return {"store": store_kind, **asdict(size), "replicas": size.replicas, "setup_s": round(setup_s, 2), **out}
