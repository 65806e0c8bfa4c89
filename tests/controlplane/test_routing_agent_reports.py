"""The routing pass with agents that observe their engines (issue 49 item 3): it reads the
observations of the replicas each heartbeat names (Node.observed_replicas) and opens no
connection to those; a replica whose agent went silent ages out and gets weight 0, kept in the
service (as after a failed scrape); a replica on a node whose agent does not observe, or one its
agent does not name (created before the agent observed engines), is still scraped from fabricd;
a node cannot name another node's replica."""

from __future__ import annotations

import asyncio
import time

from common import keyspace
from common.engine_metrics.scrape import ScrapeError
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from controlplane.routing.strategies import MAX_SCRAPE_AGE_S
from tests.controlplane.planner_data import node, replica
from tests.controlplane.test_routing_controller import PAGE, RecordingAgent
from tests.support.fake_agents import FakeAgents


class CountingScraper:
    """Stands in for fabricd's engine client: counts every GET it is asked for; none answers,
    or each answers a page with ``queue`` requests waiting."""

    def __init__(self, queue: int | None = None):
        self.gets: list[tuple[str, int]] = []
        self.queue = queue

    async def get_text(self, host, port, path="/metrics"):
        self.gets.append((host, port))
        if self.queue is None:
            raise ScrapeError("connection refused")
        return PAGE % self.queue

    def keep_only(self, origins):
        pass

    async def aclose(self):
        pass


def observed(rid: str, at: float, queue: float = 0) -> str:
    return ReplicaObservation(replica_id=rid, scraped_at=at, ok=True, queue_depth=queue).model_dump_json()


def heartbeat(store, nid: str, now: float, observed: list[str]) -> None:
    store.put(keyspace.nodes(nid), node(nid, 4).model_copy(update={
        "last_heartbeat": now, "observed_replicas": observed}).model_dump_json())


def fleet(store, now: float, observing: dict[str, bool]) -> None:
    """Replica i (qwen-i-abc) on the i-th node; a node that observes names its replica."""
    for i, (nid, observes) in enumerate(observing.items()):
        heartbeat(store, nid, now, [f"qwen-{i}-abc"] if observes else [])
    store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen",
                                                          routing="least_queue").model_dump_json())
    for i, nid in enumerate(observing):
        r = replica(i, nid, host=f"10.0.0.{i + 1}")
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())


def worker_for(store, clock, queue: int | None = None) -> tuple[RoutingWorker, CountingScraper]:
    worker = RoutingWorker(store, FakeAgents(lambda _: RecordingAgent()), vip_pool.parse_pool("10.96.0.0/30"),
                           clock=lambda: clock[0])
    scraper = CountingScraper(queue)
    worker.observer.scraper = scraper
    return worker, scraper


def test_agent_reports_route_without_a_connection_and_a_silent_agent_ages_out(store):
    clock = [time.time()]
    fleet(store, clock[0], {"n1": True, "n2": True})
    store.put(keyspace.observations("qwen-0-abc"), observed("qwen-0-abc", clock[0]))
    store.put(keyspace.observations("qwen-1-abc"), observed("qwen-1-abc", clock[0], queue=3))
    worker, scraper = worker_for(store, clock)

    async def run():
        await worker.tick()
        weights = {e.replica_id: e.weight for e in worker.memory.plans["ep"].entries}
        assert weights == {"qwen-0-abc": 32, "qwen-1-abc": 9}  # the reported queues decide
        # n1's agent keeps reporting; n2's stops (its last report ages past the window).
        clock[0] += MAX_SCRAPE_AGE_S + 1
        for i, nid in enumerate(("n1", "n2")):  # both nodes still heartbeat: only the reports stop
            heartbeat(store, nid, clock[0], [f"qwen-{i}-abc"])
        store.put(keyspace.observations("qwen-0-abc"), observed("qwen-0-abc", clock[0]))
        await worker.tick()
        entries = {e.replica_id: e for e in worker.memory.plans["ep"].entries}
        assert entries["qwen-0-abc"].weight == 32
        silent = entries["qwen-1-abc"]
        assert silent.weight == 0 and not silent.included and "old" in silent.reason
        assert silent.in_maglev  # kept in the service: its established flows stay
        await worker.aclose()

    asyncio.run(run())
    assert scraper.gets == []  # not one connection to a replica from the leader


def test_a_node_whose_agent_does_not_observe_is_scraped_from_fabricd(store):
    clock = [time.time()]
    fleet(store, clock[0], {"n1": True, "n2": False})
    store.put(keyspace.observations("qwen-0-abc"), observed("qwen-0-abc", clock[0]))
    worker, scraper = worker_for(store, clock)

    async def run():
        await worker.tick()
        await worker.aclose()

    asyncio.run(run())
    assert scraper.gets == [("10.0.0.2", 8000)]  # only n2's replica, from fabricd
    entries = {e.replica_id: e for e in worker.memory.plans["ep"].entries}
    assert entries["qwen-0-abc"].included and not entries["qwen-1-abc"].included
    stored = ReplicaObservation.model_validate_json(store.get(keyspace.observations("qwen-1-abc")).value)
    assert not stored.ok and "connection refused" in stored.error


def test_a_replica_its_observing_agent_does_not_name_is_scraped_from_fabricd_and_keeps_its_weight(store):
    """After an agent upgrade: n1's agent observes engines but knows only replicas created since
    (it names none of the two here, one placed on n1 before the upgrade and one on n2); n2 names
    n1's replica as well as its own, which counts only for its own."""
    clock = [time.time()]
    fleet(store, clock[0], {"n1": True, "n2": True})
    heartbeat(store, "n1", clock[0], [])
    heartbeat(store, "n2", clock[0], ["qwen-0-abc", "qwen-1-abc"])
    store.put(keyspace.observations("qwen-1-abc"), observed("qwen-1-abc", clock[0], queue=2))
    worker, scraper = worker_for(store, clock, queue=2)

    async def run():
        for _ in range(2):
            await worker.tick()
            clock[0] += 10
            store.put(keyspace.observations("qwen-1-abc"), observed("qwen-1-abc", clock[0], queue=2))
        await worker.aclose()

    asyncio.run(run())
    assert scraper.gets == [("10.0.0.1", 8000)] * 2  # n1's unnamed replica, each pass; never n2's
    weights = {e.replica_id: e.weight for e in worker.memory.plans["ep"].entries}
    assert weights["qwen-0-abc"] == weights["qwen-1-abc"] > 0  # the same queue: the same weight
    stored = ReplicaObservation.model_validate_json(store.get(keyspace.observations("qwen-0-abc")).value)
    assert stored.ok and stored.queue_depth == 2
