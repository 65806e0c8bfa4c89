"""Deleting an endpoint drains its VIP: the record stays Deleting while the service keeps every
backend draining at weight 0 (calls in flight finish), until the engines report nothing running
or waiting after that push (or the grace ends); then the service goes, the VIP, the record."""

import asyncio
import json

import pytest

from common import keyspace
from common.schemas import ReplicaObservation
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from tests.controlplane.test_routing_controller import RecordingAgent, seed
from tests.support.fake_agents import FakeAgents


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def observe(store, t, running):
    for rid in ("qwen-0-abc", "qwen-1-abc"):
        store.put(keyspace.observations(rid), ReplicaObservation(replica_id=rid, scraped_at=t, ok=True,
                                                                 running=running).model_dump_json())


def mark_deleting(store, t):
    kv = store.get(keyspace.endpoints("ep"))
    record = json.loads(kv.value)
    record["status"].update(phase="Deleting", deleting_since=t)
    store.put(kv.key, json.dumps(record))


@pytest.mark.parametrize("ends", ["idle", "grace"])
def test_endpoint_delete_drains_the_vip_then_releases_it(store, ends):
    clock = Clock(1_000_000.0)
    seed(store, clock.t)
    agents = FakeAgents(lambda _: RecordingAgent())
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), clock=clock, drain_grace_s=30)
    worker.scrape_all = lambda snap: asyncio.sleep(0)  # observations are written by the test
    service = ("10.96.0.1", 8000, "tcp")

    async def tick():
        await worker.tick()

    asyncio.run(tick())
    assert agents.by_node["n1"].services[service]["10.0.0.1:8000"] > 0
    mark_deleting(store, clock.t)
    observe(store, clock.t, running=2)
    for _ in range(2):
        clock.t += 1
        observe(store, clock.t, running=2)
        asyncio.run(tick())
        ep = json.loads(store.get(keyspace.endpoints("ep")).value)
        assert ep["status"]["phase"] == "Deleting" and "drains the calls in flight" in ep["status"]["message"]
        assert agents.by_node["n1"].services[service] == {"10.0.0.1:8000": 0, "10.0.0.2:8000": 0}
        assert vip_pool.owner_of(store, "10.96.0.1") == "ep"
    clock.t += 1 if ends == "idle" else 30
    observe(store, clock.t, running=0 if ends == "idle" else 2)
    asyncio.run(tick())
    assert service not in agents.by_node["n1"].services
    assert vip_pool.owner_of(store, "10.96.0.1") is None
    assert store.get(keyspace.endpoints("ep")) is None
    asyncio.run(worker.aclose())
