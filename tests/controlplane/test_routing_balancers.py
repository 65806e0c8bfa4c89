"""Balancer nodes (issue 49 item 1): the routing controller's push sends services only to nodes with
the balancer role; a GPU host without it gets nothing, and a role change moves the services on the
next pass (a new balancer gets every service in one request, a former one has each removed).
Agents are in-memory (tests.support.fake_agents) behind the real RoutingWorker and store."""

import asyncio
import time

from common import keyspace
from common.records import nodes as node_records
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from controlplane.routing.push import held, service_address
from tests.controlplane.planner_data import node, replica
from tests.controlplane.test_routing_controller import RecordingAgent
from tests.support.fake_agents import FakeAgents

BALANCERS = ("lb1", "lb2")
GPU_HOSTS = ("gpu1", "gpu2", "gpu3")


def seed(store, now, endpoints=3):
    for n in BALANCERS + GPU_HOSTS:
        node_records.put(store, node(n, 4, balancer=n in BALANCERS).model_copy(update={"last_heartbeat": now}))
    for e in range(endpoints):
        dep = f"d{e}"
        store.put(keyspace.endpoints(f"ep{e}"), InferenceEndpoint(name=f"ep{e}", deployment=dep).model_dump_json())
        for i, host in enumerate(GPU_HOSTS[:2]):  # the replicas live on GPU hosts, not on the balancers
            r = replica(i, host, host=f"10.{e}.0.{i + 1}").model_copy(
                update={"deployment": dep, "replica_id": f"{dep}-{i}"})
            store.put(keyspace.replicas(dep, r.replica_id), r.model_dump_json())
            store.put(keyspace.observations(r.replica_id), ReplicaObservation(
                replica_id=r.replica_id, scraped_at=now, ok=True).model_dump_json())


class Agent(RecordingAgent):
    def __init__(self):
        super().__init__()
        self.deletes: list[str] = []

    async def delete_service(self, vip, port, proto):
        self.deletes.append(f"{vip}:{port}/{proto}")
        return await super().delete_service(vip, port, proto)


def worker_on(store, now):
    agents = FakeAgents(lambda _: Agent())
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/29"), clock=lambda: now)
    worker.scrape_all = lambda snap: asyncio.sleep(0)
    return worker, agents


def set_balancer(store, node_id, balancer, heartbeat=None, report=None):
    def change(n):
        update = {"balancer": balancer}
        if heartbeat is not None:
            update.update(last_heartbeat=heartbeat, service_generations=report or {})
        return n.model_copy(update=update)
    node_records.update(store, node_id, change)


def test_held_names_what_a_former_balancer_still_has():
    wanted = {"a": 2, "b": 1}
    assert held(wanted, {"a": (2, 10.0)}, {}, 5.0, {}) == ["a"]  # acknowledged here
    assert held(wanted, {}, {"b": 1, "z": 1}, 5.0, {}) == ["b"]  # reported (z is no service of this pass)
    assert held(wanted, {}, {"b": 1}, 5.0, {"b": 6.0}) == []  # removed after that heartbeat
    assert held(wanted, {}, {"b": 1}, 7.0, {"b": 6.0}) == ["b"]  # a newer heartbeat still has it
    assert service_address("10.96.0.2:8000/tcp") == ("10.96.0.2", 8000, "tcp")


def one_tick(worker) -> None:
    async def run():
        await worker.tick()
        await worker.aclose()

    asyncio.run(run())


def test_push_sends_services_only_to_balancers(store):
    now = time.time()
    seed(store, now)
    worker, agents = worker_on(store, now)
    one_tick(worker)
    assert sorted(agents.by_node) == sorted(BALANCERS)  # a GPU host's agent is never asked for anything
    for lb in BALANCERS:
        assert (agents.by_node[lb].requests, agents.by_node[lb].puts) == (1, 3)  # one batch, every endpoint
    # Same services and weights on both balancers (a flow ECMP moves picks the same backend).
    assert agents.by_node["lb1"].services == agents.by_node["lb2"].services
    assert {b for s in agents.by_node["lb1"].services.values() for b in s} == {
        f"10.{e}.0.{i}:8000" for e in range(3) for i in (1, 2)}  # the GPU hosts' replicas are the backends
    assert worker.pushes.sent == 6 and worker.pushes.requests == 2


def test_a_role_change_moves_services_on_the_next_pass(store):
    now = time.time()
    seed(store, now)
    worker, agents = worker_on(store, now)

    async def run():
        await worker.tick()
        set_balancer(store, "gpu3", True)  # an admin gives gpu3 the role, takes it from lb2
        set_balancer(store, "lb2", False)
        await worker.tick()
        new, former = agents.by_node["gpu3"], agents.by_node["lb2"]
        assert (new.requests, new.puts) == (1, 3)  # every service, one request
        assert new.services == agents.by_node["lb1"].services
        assert sorted(former.deletes) == sorted(agents.by_node["lb1"].generations)  # each service, once
        assert former.services == {}
        assert agents.by_node["lb1"].requests == 1  # nothing moved for the balancer that stayed
        await worker.tick()  # nothing is sent or removed again (lb2's heartbeat predates the removal)
        assert (new.requests, len(former.deletes)) == (1, 3)
        # A later heartbeat of lb2 still reporting a service (a restarted agent reloading its
        # pins, say): removed again, that one only.
        key = sorted(former.deletes)[0]
        set_balancer(store, "lb2", False, heartbeat=now + 1, report={key: 1})
        await worker.tick()
        assert former.deletes[3:] == [key]
        await worker.aclose()

    asyncio.run(run())
    assert worker.pushes.withdrawn == 4


def test_an_endpoint_deleted_asks_only_the_nodes_that_may_hold_it(store):
    now = time.time()
    seed(store, now, endpoints=1)
    worker, agents = worker_on(store, now)

    async def run():
        await worker.tick()
        ep = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints("ep0")).value)
        ep.status.phase = "Deleting"
        ep.status.deleting_since = now - 3600  # the drain grace is over
        store.put(keyspace.endpoints("ep0"), ep.model_dump_json())
        await worker.tick()
        await worker.aclose()

    asyncio.run(run())
    assert store.get(keyspace.endpoints("ep0")) is None  # removed everywhere it was: the VIP went back
    assert sorted(agents.by_node) == sorted(BALANCERS)  # no GPU host was asked to delete anything
    assert all(a.services == {} for a in agents.by_node.values())
