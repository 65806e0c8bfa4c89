"""The routing controller's Maglev and VIP ordering on a real SQLite store, with a recording
agent behind the AgentClients interface we own (for_node -> async put/delete_service)."""

import asyncio
import time

import pytest

from common import keyspace
from common.errors import TransientError
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane import vip_pool
from controlplane.routing.controller import RoutingWorker
from tests.controlplane.planner_data import node, replica


class RecordingAgent:
    def __init__(self):
        self.services: dict[tuple, dict] = {}
        self.puts = 0
        self.unreachable = False

    async def put_service(self, vip, port, proto, spec):
        if self.unreachable:
            raise TransientError("agent unreachable")
        self.puts += 1
        self.services[(vip, port, proto)] = dict(spec.backends)

    async def delete_service(self, vip, port, proto):
        if self.unreachable:
            raise TransientError("agent unreachable")
        return self.services.pop((vip, port, proto), None) is not None  # False = 404


class Agents:
    def __init__(self):
        self.by_node = {}

    def for_node(self, n):
        return self.by_node.setdefault(n.id, RecordingAgent())


@pytest.fixture
def store(tmp_path):
    from common.store.sqlite_store import SqliteStore

    s = SqliteStore(tmp_path / "fabric.db")
    yield s
    s.close()


def seed(store, now):
    n = node("n1", 4)
    store.put(keyspace.nodes("n1"), n.model_copy(update={"last_heartbeat": now}).model_dump_json())
    store.put(keyspace.endpoints("ep"), InferenceEndpoint(name="ep", deployment="qwen",
                                                          routing="least_queue").model_dump_json())
    for i, queue in ((0, 0), (1, 3)):
        r = replica(i, "n1", host=f"10.0.0.{i + 1}")
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
        store.put(keyspace.observations(r.replica_id), ReplicaObservation(
            replica_id=r.replica_id, scraped_at=now, ok=True, queue_depth=queue).model_dump_json())


def test_push_on_change_and_maglev_absent_before_vip_release(store):
    now = time.time()
    seed(store, now)
    agents = Agents()
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"))
    worker.scrape_all = lambda snap: asyncio.sleep(0)  # observations are seeded, not scraped here

    async def run():
        await worker.tick()
        agent = agents.by_node["n1"]
        assert agent.services == {("10.96.0.1", 8000, "tcp"): {"10.0.0.1:8000": 32, "10.0.0.2:8000": 9}}
        await worker.tick()
        assert agent.puts == 1  # unchanged weights are not pushed again
        store.delete(keyspace.endpoints("ep"))
        agent.unreachable = True
        await worker.tick()
        assert vip_pool.owner_of(store, "10.96.0.1") == "ep"  # agent unreachable: VIP kept
        agent.unreachable = False
        await worker.tick()
        assert agent.services == {}
        assert vip_pool.owner_of(store, "10.96.0.1") is None
        await worker.aclose()

    asyncio.run(run())


def test_a_404_on_delete_counts_as_absent(store):
    now = time.time()
    seed(store, now)
    agents = Agents()
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"))
    worker.scrape_all = lambda snap: asyncio.sleep(0)

    async def run():
        await worker.tick()
        agents.by_node["n1"].services.clear()  # the agent lost it (restart): its DELETE will be 404
        store.delete(keyspace.endpoints("ep"))
        await worker.tick()
        assert vip_pool.owner_of(store, "10.96.0.1") is None
        await worker.aclose()

    asyncio.run(run())
