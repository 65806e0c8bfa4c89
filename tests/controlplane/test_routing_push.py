"""Pushes by generation (controlplane.routing.push): once, on change, one request per agent per
pass, each agent its own queue and deadline. The silent agent is a real TCP server on loopback
that accepts and never answers, reached through the real AgentClient."""

import asyncio
import time

from common import keyspace
from common.records import plans
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane.agent_client import AgentClient
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from controlplane.routing.push import due
from tests.controlplane.planner_data import node, replica
from tests.controlplane.test_routing_controller import RecordingAgent
from tests.support.fake_agents import FakeAgents


def seed(store, now, endpoints=1, nodes=("n1",), queue=0):
    for n in nodes:
        store.put(keyspace.nodes(n), node(n, 4).model_copy(update={"last_heartbeat": now}).model_dump_json())
    for e in range(endpoints):
        dep = f"d{e}"
        store.put(keyspace.endpoints(f"ep{e}"), InferenceEndpoint(name=f"ep{e}", deployment=dep,
                                                                  routing="least_queue").model_dump_json())
        for i in range(2):
            r = replica(i, nodes[0], host=f"10.{e}.0.{i + 1}").model_copy(
                update={"deployment": dep, "replica_id": f"{dep}-{i}"})
            store.put(keyspace.replicas(dep, r.replica_id), r.model_dump_json())
            store.put(keyspace.observations(r.replica_id), ReplicaObservation(
                replica_id=r.replica_id, scraped_at=now, ok=True, queue_depth=queue * i).model_dump_json())


def test_due_names_what_moved_and_what_the_heartbeat_says_is_lost():
    acked = {"a": (3, 100.0), "b": (5, 100.0)}
    assert due({"a": 3, "b": 5}, acked, {"a": 3, "b": 5}, 200.0) == []
    assert due({"a": 4, "b": 5}, acked, {}, 50.0) == ["a"]  # a moved; an older heartbeat says nothing
    assert due({"a": 3, "b": 5}, acked, {"a": 3}, 200.0) == ["b"]  # newer heartbeat: b is gone there
    assert due({"a": 3, "c": 1}, acked, {}, 50.0) == ["c"]  # never sent


def test_pushes_per_pass_follow_changed_endpoints_times_agents(store):
    now = time.time()
    seed(store, now, endpoints=3, nodes=("n1", "n2"))
    agents = FakeAgents(lambda _: RecordingAgent())
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/29"), clock=lambda: now)
    worker.scrape_all = lambda snap: asyncio.sleep(0)

    def counts():
        return {n: (a.requests, a.puts) for n, a in sorted(agents.by_node.items())}

    async def run():
        await worker.tick()
        assert counts() == {"n1": (1, 3), "n2": (1, 3)}  # 3 endpoints x 2 agents, one request each
        first = {p.endpoint: p.generation for p in plans.list(store)}
        await worker.tick()
        assert counts() == {"n1": (1, 3), "n2": (1, 3)}  # nothing moved: no request at all
        obs = ReplicaObservation(replica_id="d1-1", scraped_at=now, ok=True, queue_depth=9)
        store.put(keyspace.observations("d1-1"), obs.model_dump_json())  # ep1's weights move
        await worker.tick()
        assert counts() == {"n1": (2, 4), "n2": (2, 4)}  # 1 changed endpoint x 2 agents
        second = {p.endpoint: p.generation for p in plans.list(store)}
        assert second["ep0"] == first["ep0"] and second["ep2"] == first["ep2"]
        assert second["ep1"] > first["ep1"]
        held = agents.by_node["n1"].specs[("10.96.0.2", 8000, "tcp")]
        assert held.generation == second["ep1"]  # the agent holds exactly the published service
        assert plans.get(store, "ep1").service.backends == held.backends
        await worker.aclose()

    asyncio.run(run())


class SilentServer:
    """Accepts connections and reads, never answers."""

    def __init__(self):
        self.accepted = 0
        self.writers = []

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def handle(self, reader, writer):
        self.accepted += 1
        self.writers.append(writer)
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass

    def close(self):
        for w in self.writers:
            w.close()
        self.server.close()


def test_a_silent_agent_delays_no_other_agents_push_and_is_skipped_until_it_answers(store):
    now = time.time()
    seed(store, now, endpoints=1, nodes=("good", "silent"))
    clock = [now]

    async def run():
        silent = await SilentServer().start()
        client = AgentClient(f"http://127.0.0.1:{silent.port}", timeout=60.0)  # outlives the test
        good = RecordingAgent()
        agents = FakeAgents(lambda _: RecordingAgent())
        agents.by_node = {"good": good, "silent": client}
        worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), clock=lambda: clock[0],
                               push_deadline_s=0.5)
        worker.scrape_all = lambda snap: asyncio.sleep(0)
        await worker.tick()
        pushes = worker.pushes
        assert good.puts == 1 and pushes.of("good").silent_since is None
        assert silent.accepted == 1 and pushes.of("silent").busy  # its request is still out, unanswered
        assert pushes.silent("silent")
        ep = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints("ep0")).value)
        assert "agent silent silent" in ep.status.message and "skipped until it answers" in ep.status.message

        # the plan moves: the good agent gets it; the silent one gets no second request while its
        # first is out, and the pass does not wait for it (it would wait the deadline if it did)
        store.put(keyspace.observations("d0-1"), ReplicaObservation(
            replica_id="d0-1", scraped_at=now, ok=True, queue_depth=9).model_dump_json())
        first_request = pushes.of("silent").task
        await worker.tick()
        assert good.puts == 2 and good.requests == 2
        assert pushes.waited == ["good"]  # the pass waited on the good agent alone
        assert pushes.of("silent").task is first_request
        assert silent.accepted == 1 and pushes.requests == 3
        held = good.specs[("10.96.0.1", 8000, "tcp")]
        assert held.generation == plans.get(store, "ep0").generation
        pushes.of("silent").task.cancel()
        silent.close()
        await client.aclose()
        await worker.aclose()

    asyncio.run(run())


def test_a_deleted_silent_node_takes_its_queue_and_its_status_note_with_it(store):
    """A silent agent's node is deleted: its queue goes (its request out is cancelled) and the
    endpoints' statuses stop naming it; the queues hold only registered nodes."""
    now = time.time()
    seed(store, now, endpoints=1, nodes=("good", "silent"))

    async def run():
        silent = await SilentServer().start()
        client = AgentClient(f"http://127.0.0.1:{silent.port}", timeout=60.0)
        agents = FakeAgents(lambda _: RecordingAgent())
        agents.by_node = {"good": RecordingAgent(), "silent": client}
        worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), clock=lambda: now,
                               push_deadline_s=0.5)
        worker.scrape_all = lambda snap: asyncio.sleep(0)
        await worker.tick()
        out = worker.pushes.of("silent").task
        assert worker.pushes.silent("silent") and out is not None and not out.done()

        store.delete(keyspace.nodes("silent"))
        store.put(keyspace.observations("d0-1"), ReplicaObservation(
            replica_id="d0-1", scraped_at=now, ok=True, queue_depth=9).model_dump_json())  # a status rewrite
        await worker.tick()
        await asyncio.sleep(0)
        assert sorted(worker.pushes.by_node) == ["good"] and not worker.pushes.silent("silent")
        assert out.cancelled()
        ep = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints("ep0")).value)
        assert "silent" not in ep.status.message
        silent.close()
        await client.aclose()
        await worker.aclose()

    asyncio.run(run())
