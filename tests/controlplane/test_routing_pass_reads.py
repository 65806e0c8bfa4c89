"""What a routing pass asks the store: its records come from the leader's Mirror (listed once,
then only changes), so the VIP owners and everything else are never listed per endpoint. Counted
with lab.rigs.scale.CountingStore on a real SQLite store; the agents observe their engines
(Node.observed_replicas names each), so no pass scrapes. (Trimming the event log lists it, once
per 50 events a loop writes: common.records.events, so per change, not per pass.) What a pass
decided (new plans, weight events) is written in one batch each."""

from __future__ import annotations

import asyncio
import time

from common import keyspace
from common.records import plans
from common.records.events import recent_events
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from lab.rigs.scale import CountingStore
from tests.controlplane.planner_data import node, replica
from tests.controlplane.test_routing_controller import RecordingAgent
from tests.support.fake_agents import FakeAgents


def fleet(store, nodes: int, endpoints: int, now: float) -> None:
    observed: dict[str, list[str]] = {f"n{n}": [] for n in range(nodes)}
    for e in range(endpoints):
        for i in range(2):
            observed[f"n{(e + i) % nodes}"].append(f"d{e}-{i}")
    for nid, rids in observed.items():
        store.put(keyspace.nodes(nid), node(nid, 4).model_copy(update={
            "last_heartbeat": now, "observed_replicas": rids}).model_dump_json())
    for e in range(endpoints):
        store.put(keyspace.endpoints(f"ep{e}"), InferenceEndpoint(name=f"ep{e}", deployment=f"d{e}",
                                                                  routing="least_queue").model_dump_json())
        for i in range(2):
            r = replica(i, f"n{(e + i) % nodes}", host=f"10.0.{e}.{i + 1}").model_copy(update={
                "replica_id": f"d{e}-{i}", "deployment": f"d{e}"})
            store.put(keyspace.replicas(f"d{e}", r.replica_id), r.model_dump_json())
            store.put(keyspace.observations(r.replica_id), ReplicaObservation(
                replica_id=r.replica_id, scraped_at=now, ok=True, queue_depth=i).model_dump_json())


class Lists(CountingStore):
    """Also notes the prefix of each list (CountingStore counts the other verbs)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.prefixes: list[str] = []

    def list(self, prefix):
        if not prefix.startswith(keyspace.events()):
            self.prefixes.append(prefix)
        return self.inner.list(prefix)


async def passes(store, nodes: int, endpoints: int) -> list[tuple[dict[str, int], list[str]]]:
    """The read calls (by verb) and the prefixes listed (the event log's aside) of three passes:
    the first, an idle one, and one after a change."""
    now = time.time()
    fleet(store, nodes, endpoints, now)
    counted = Lists(store)
    worker = RoutingWorker(counted, FakeAgents(lambda _: RecordingAgent()), vip_pool.parse_pool("10.96.0.0/24"),
                           clock=lambda: now)
    out = []
    try:
        for label in ("first", "idle", "change"):
            if label == "change":  # one replica's queue moves, as its agent reports
                store.put(keyspace.observations("d0-0"), ReplicaObservation(
                    replica_id="d0-0", scraped_at=now, ok=True, queue_depth=5).model_dump_json())
            before, listed = dict(counted.calls), len(counted.prefixes)
            await worker.tick()
            out.append(({verb: n - before.get(verb, 0) for verb, n in counted.calls.items() if n != before.get(verb, 0)},
                        sorted(counted.prefixes[listed:])))
        assert len(worker.memory.published) == endpoints and len({p.vip for p in worker.memory.published.values()}) \
            == endpoints  # every endpoint routed, each with its own VIP
    finally:
        await worker.aclose()
    return out


def test_a_pass_lists_nothing_once_its_mirror_is_warm_whatever_the_fleet(tmp_path):
    from common.store.sqlite_store import SqliteStore

    small = asyncio.run(passes(SqliteStore(tmp_path / "small.db"), nodes=2, endpoints=2))
    big = asyncio.run(passes(SqliteStore(tmp_path / "big.db"), nodes=6, endpoints=9))
    mirrored = sorted(keyspace.ROOT + f"/{kind}/" for kind in (
        "nodes", "endpoints", "sites", "replicas", "observations", "routing-plans", "managed/services", "vips"))
    # the first pass lists each prefix it reads once: not the VIP owners once per endpoint
    assert small[0][1] == big[0][1] == mirrored
    for few, many in zip(small[1:], big[1:]):
        assert few[1] == many[1] == []  # later passes list nothing: the mirror asks for changes (changed_since)
        assert few[0] == many[0]  # the same calls whatever the number of endpoints and nodes
        assert few[0]["changed_since"] == len(mirrored)


def test_a_pass_writes_its_plans_and_weight_events_in_one_batch_each(tmp_path):
    from common.store.sqlite_store import SqliteStore

    store = SqliteStore(tmp_path / "f.db")
    now = time.time()
    fleet(store, nodes=6, endpoints=9, now=now)
    counted = CountingStore(store)
    worker = RoutingWorker(counted, FakeAgents(lambda _: RecordingAgent()), vip_pool.parse_pool("10.96.0.0/24"),
                           clock=lambda: now)

    async def first_pass() -> None:
        try:
            await worker.tick()
        finally:
            await worker.aclose()

    asyncio.run(first_pass())
    assert counted.items["routing-plans"] == 9 and "routing-plans" not in counted.written  # no plan put alone
    assert counted.written["batch"] == 2  # the nine plans, then the nine WeightsChanged events
    weights = [e for e in recent_events(store, 100) if e.action == "WeightsChanged"]
    assert sorted(e.name for e in weights) == [f"ep{e}" for e in range(9)]
    assert sorted(p.endpoint for p in plans.list(store)) == [f"ep{e}" for e in range(9)]
