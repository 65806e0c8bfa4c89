"""An endpoint's `forwarding` end to end in the control plane: the routing plan keeps off Maglev
the replicas that cannot answer dsr-ipip, the routing controller sends the mode with every
service it puts on an agent, and a new replica of an exposed deployment gets the VIP in its VM
create request. Real SQLite store; the agents are recorders behind the AgentClients interface
we own (for_node -> put_services / create_vm), as in test_routing_controller and the reconcile tests."""

from __future__ import annotations

import asyncio
import time

from common import keyspace
from common.agent_api import GpuBindResult, MaglevBatchResult, MaglevPutResult, VmInfo
from common.schemas import InferenceEndpoint, Replica, ReplicaObservation
from controlplane.placement import vip_pool
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from controlplane.routing.controller import RoutingWorker
from controlplane.routing.strategies import plan_routing
from tests.controlplane.planner_data import NOW, deployment, model, node, profile, replica
from tests.support.fake_agents import FakeAgents

VIP = "10.96.0.1"


def dsr_endpoint(**kw) -> InferenceEndpoint:
    return InferenceEndpoint(name="ep", deployment="qwen", forwarding="dsr-ipip", **kw)


def fresh(r):
    return ReplicaObservation(replica_id=r.replica_id, scraped_at=NOW, ok=True)


# -- the plan ---------------------------------------------------------------------------------------

def test_dsr_plan_routes_through_maglev_only_replicas_made_with_the_vip_on_the_vip_port():
    with_vip = replica(0, host="10.0.0.1").model_copy(update={"dsr_vips": [VIP]})
    without = replica(1, host="10.0.0.2")
    other_port = replica(2, host="10.0.0.3").model_copy(update={"dsr_vips": [VIP], "port": 9000})
    replicas = [with_vip, without, other_port]
    obs = {r.replica_id: fresh(r) for r in replicas}
    nodes = {"n1": node("n1", 4)}

    plan = plan_routing(dsr_endpoint(), replicas, obs, nodes, NOW, vip=VIP)
    assert plan.backends == (("10.0.0.1", 8000, 1),)
    entries = {e.replica_id: e for e in plan.entries}
    assert all(e.included for e in entries.values())  # the gateway still routes to all three
    assert f"created without VIP {VIP}" in entries[without.replica_id].reason
    assert "port 8000, it serves on 9000" in entries[other_port.replica_id].reason

    nat = plan_routing(dsr_endpoint().model_copy(update={"forwarding": "nat"}), replicas, obs, nodes, NOW, vip=VIP)
    assert len(nat.backends) == 3  # nat needs nothing of the replica

    # Without a VIP yet (status empty, none passed) no replica can be a dsr backend.
    assert plan_routing(dsr_endpoint(), replicas, obs, nodes, NOW).backends == ()


def test_dsr_vips_of_a_deployment_are_those_of_its_dsr_endpoints_holding_one():
    endpoints = [dsr_endpoint(), InferenceEndpoint(name="plain", deployment="qwen"),
                 InferenceEndpoint(name="elsewhere", deployment="other", forwarding="dsr-ipip"),
                 InferenceEndpoint(name="second", deployment="qwen", forwarding="dsr-ipip"),
                 InferenceEndpoint(name="no-vip-yet", deployment="qwen", forwarding="dsr-ipip")]
    owners = {"10.96.0.10": "second", VIP: "ep", "10.96.0.2": "plain", "10.96.0.3": "elsewhere"}
    assert vip_pool.dsr_vips("qwen", endpoints, owners) == [VIP, "10.96.0.10"]
    assert vip_pool.dsr_vips("absent", endpoints, owners) == []


# -- the routing controller -------------------------------------------------------------------------

class RecordingAgent:
    def __init__(self):
        self.specs: list = []

    async def put_services(self, batch, timeout=None):
        self.specs.extend(((s.vip, s.port, s.proto), s) for s in batch)
        return MaglevBatchResult(results=[MaglevPutResult(key=s.key, generation=s.generation, outcome="applied",
                                                          held=s.generation) for s in batch])

    async def delete_service(self, vip, port, proto):
        return True


def test_the_controller_puts_the_endpoints_mode_and_pushes_again_when_it_changes(store):
    now = time.time()
    store.put(keyspace.nodes("n1"), node("n1", 4).model_copy(update={"last_heartbeat": now}).model_dump_json())
    store.put(keyspace.endpoints("ep"), dsr_endpoint().model_dump_json())
    for i, vips in ((0, [VIP]), (1, [])):
        r = replica(i, host=f"10.0.0.{i + 1}").model_copy(update={"dsr_vips": vips})
        store.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
        store.put(keyspace.observations(r.replica_id), fresh(r).model_copy(update={"scraped_at": now})
                  .model_dump_json())
    agents = FakeAgents(lambda _: RecordingAgent())
    worker = RoutingWorker(store, agents, vip_pool.parse_pool("10.96.0.0/30"), clock=lambda: now)
    worker.scrape_all = lambda snap: asyncio.sleep(0)  # observations are seeded, not scraped here

    async def run():
        await worker.tick()  # the first tick takes the VIP and plans with it
        agent = agents.by_node["n1"]
        [(service, spec)] = agent.specs
        assert service == (VIP, 8000, "tcp")
        assert spec.forwarding == "dsr-ipip" and spec.backends == {"10.0.0.1:8000": 1}
        status = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints("ep")).value).status
        assert "(dsr-ipip)" in status.message
        await worker.tick()
        assert len(agent.specs) == 1  # nothing changed: nothing pushed

        ep = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints("ep")).value)
        store.put(keyspace.endpoints("ep"), ep.model_copy(update={"forwarding": "nat"}).model_dump_json())
        await worker.tick()
        spec = agent.specs[-1][1]
        assert spec.forwarding == "nat" and spec.backends == {"10.0.0.1:8000": 1, "10.0.0.2:8000": 1}
        await worker.aclose()

    asyncio.run(run())


# -- the VM create request --------------------------------------------------------------------------

class VmAgent:
    def __init__(self, agents):
        self.agents = agents

    async def bind_gpu(self, pci):
        return GpuBindResult(bdf=pci, changed=False)

    async def create_vm(self, req):
        self.agents.requests.append(req)
        return VmInfo(id=req.replica_id, state="running", host="10.0.0.7", port=8000)


def test_a_new_replica_of_a_dsr_exposed_deployment_gets_the_vip_in_its_vm_request(store):
    store.put(keyspace.models("qwen"), model().model_dump_json())
    store.put(keyspace.profiles("p24"), profile().model_dump_json())
    store.put(keyspace.nodes("n1"), node("n1", 2).model_copy(update={"last_heartbeat": time.time() + 600})
              .model_dump_json())
    store.put(keyspace.deployments("qwen"), deployment(1).model_dump_json())
    store.put(keyspace.endpoints("ep"), dsr_endpoint().model_dump_json())
    store.put(keyspace.endpoints("plain"), InferenceEndpoint(name="plain", deployment="qwen").model_dump_json())
    pool = vip_pool.parse_pool("10.96.0.0/29")
    vip = vip_pool.allocate(store, "ep", pool)
    vip_pool.allocate(store, "plain", pool)
    agents = FakeAgents(VmAgent, requests=[])

    async def run():
        worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
        await worker.tick()
        await worker.aclose()

    asyncio.run(run())
    [req] = agents.requests
    assert req.dsr_vips == [vip]
    [kv] = store.list(keyspace.replicas("qwen", ""))
    assert Replica.model_validate_json(kv.value).dsr_vips == [vip]  # the record says what the VM holds
