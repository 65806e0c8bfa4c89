"""The routing pass with agents that observe their engines (issue 49 item 3): it reads their
reported observations and opens no connection to those replicas; a replica whose agent went
silent ages out and gets weight 0, kept in the service (as after a failed scrape); a replica on
a node whose agent does not observe is still scraped from fabricd."""

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
from tests.controlplane.test_routing_controller import RecordingAgent
from tests.support.fake_agents import FakeAgents


class CountingScraper:
    """Stands in for fabricd's engine client: counts every GET it is asked for; none answers."""

    def __init__(self):
        self.gets: list[tuple[str, int]] = []

    async def get_text(self, host, port, path="/metrics"):
        self.gets.append((host, port))
        raise ScrapeError("connection refused")

    def keep_only(self, origins):
        pass

    async def aclose(self):
        pass


def observed(rid: str, at: float, queue: float = 0) -> str:
    return ReplicaObservation(replica_id=rid, scraped_at=at, ok=True, queue_depth=queue).model_dump_json()


def fleet(store, now: float, observing: dict[str, bool]) -> None:
    for nid, observes in observing.items():
        store.put(keyspace.nodes(nid), node(nid, 4).model_copy(update={
            "last_heartbeat": now, "observes_engines": observes}).model_dump_json())
    store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen",
                                                          routing="least_queue").model_dump_json())
    for i, nid in enumerate(observing):
        r = replica(i, nid, host=f"10.0.0.{i + 1}")
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())


def worker_for(store, clock) -> tuple[RoutingWorker, CountingScraper]:
    worker = RoutingWorker(store, FakeAgents(lambda _: RecordingAgent()), vip_pool.parse_pool("10.96.0.0/30"),
                           clock=lambda: clock[0])
    scraper = CountingScraper()
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
        for nid in ("n1", "n2"):  # both nodes still heartbeat: only the reports stop
            store.put(keyspace.nodes(nid), node(nid, 4).model_copy(update={
                "last_heartbeat": clock[0], "observes_engines": True}).model_dump_json())
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
