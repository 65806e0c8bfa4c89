"""A create that stopped half way (fabricd killed, or its lease lost, between writing the replica
record and reserving its GPUs) is finished by the next pass of any process: the reservations
are taken before the agent binds anything, and never shared with another replica."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from common import keyspace
from common.agent_api import GpuBindResult, VmInfo
from common.schemas import Replica
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker, reserve_gpus
from tests.controlplane.reconcile_support import seeded_store
from tests.support.fake_agents import FakeAgents

GPU0 = "0000:10:00.0"


class Agent:
    def __init__(self, calls):
        self.calls = calls

    async def bind_gpu(self, pci):
        self.calls.append(("bind", pci))
        return GpuBindResult(bdf=pci, changed=False)

    async def create_vm(self, req):
        self.calls.append(("create_vm", req.replica_id))
        return VmInfo(id=req.replica_id, state="running", host="127.0.0.1", port=9)


@pytest.fixture
def store(tmp_path):
    s = seeded_store(tmp_path)
    yield s
    s.close()


def half_created(store, rid="qwen-0-aaaaaa") -> Replica:
    r = Replica(replica_id=rid, deployment="qwen", ordinal=0, node="n1", gpus=[GPU0], phase="Pending",
                created_at=time.time())
    store.put(keyspace.replicas("qwen", rid), r.model_dump_json())
    return r


def owner(store, pci=GPU0):
    kv = store.get(keyspace.gpu_reservations("n1", pci))
    return None if kv is None else json.loads(kv.value)["replica_id"]


def tick(store, agents):
    async def run():
        worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
        await worker.tick()
        await worker.aclose()

    asyncio.run(run())


def test_the_next_pass_reserves_before_binding(store):
    r = half_created(store)
    agents = FakeAgents(lambda pool: Agent(pool.calls))
    tick(store, agents)
    assert owner(store) == r.replica_id
    assert agents.calls == [("bind", GPU0), ("create_vm", r.replica_id)]
    assert [kv.key for kv in store.list(keyspace.replicas())] == [keyspace.replicas("qwen", r.replica_id)]


def test_a_gpu_taken_meanwhile_is_never_shared(store):
    r = half_created(store)
    assert reserve_gpus(store, "n1", [GPU0], "other-0-bbbbbb", "other", time.time())
    agents = FakeAgents(lambda pool: Agent(pool.calls))
    tick(store, agents)
    assert owner(store) == "other-0-bbbbbb"
    assert ("bind", GPU0) not in agents.calls  # the other replica's GPU is left alone
    assert store.get(keyspace.replicas("qwen", r.replica_id)) is None  # dropped, to be placed again
    assert "held by another replica" in json.loads(store.get(keyspace.deployments("qwen")).value)["status"]["message"]
    tick(store, agents)  # the next pass places ordinal 0 again, on the free GPU
    [again] = [Replica.model_validate_json(kv.value) for kv in store.list(keyspace.replicas())]
    assert again.ordinal == 0 and again.gpus == ["0000:11:00.0"] and owner(store, "0000:11:00.0") == again.replica_id


def test_reserving_again_for_the_same_replica_is_idempotent(store):
    assert reserve_gpus(store, "n1", [GPU0], "r-0-a", "qwen", 1.0)
    assert reserve_gpus(store, "n1", [GPU0, "0000:11:00.0"], "r-0-a", "qwen", 2.0)
    assert not reserve_gpus(store, "n1", ["0000:11:00.0"], "r-1-b", "qwen", 3.0)
    assert owner(store, "0000:11:00.0") == "r-0-a"
