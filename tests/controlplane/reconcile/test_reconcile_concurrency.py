"""The reconciler works on up to 4 deployments at once, each under its own lock: a deployment
whose agent call hangs does not hold the others back, two passes never work on one deployment
at the same time, and deployments planned in one pass never take the same GPU."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from common import keyspace
from common.agent_api import GpuBindResult, VmInfo
from common.schemas import InferenceDeployment
from common.store.sqlite_store import SqliteStore
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import CONCURRENCY, ReconcileWorker
from lab.rigs.polling import wait_for_async
from tests.controlplane.planner_data import model, node, profile
from tests.support.fake_agents import FakeAgents

NAMES = [f"d{i}" for i in range(6)]


class Agent:
    def __init__(self, owner):
        self.owner = owner

    async def bind_gpu(self, pci):
        return GpuBindResult(bdf=pci, changed=False)

    async def list_vms(self):
        return []

    async def delete_vm(self, vm_id):
        self.owner.deleted.append(vm_id)
        return True

    async def release_gpu(self, pci):
        return GpuBindResult(bdf=pci, changed=False)

    async def create_vm(self, req):
        o = self.owner
        o.active.add(req.deployment)
        o.peak = max(o.peak, len(o.active))
        o.overlap |= req.deployment in o.inside
        o.inside.add(req.deployment)
        try:
            if req.deployment == "d0":
                await o.release.wait()  # d0's agent hangs until the test lets it go
            else:
                await asyncio.sleep(0.05)
        finally:
            o.active.discard(req.deployment)
            o.inside.discard(req.deployment)
        o.done.append(req.deployment)
        return VmInfo(id=req.replica_id, state="running", host="127.0.0.1", port=9)


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "fabric.db")
    s.put(keyspace.models("qwen"), model().model_dump_json())
    s.put(keyspace.profiles("p24"), profile().model_dump_json())
    s.put(keyspace.nodes("n1"), node("n1", 8).model_copy(update={"last_heartbeat": time.time() + 600,
                                                             "address": "https://127.0.0.1:7443"})
          .model_dump_json())
    for name in NAMES:
        s.put(keyspace.deployments(name), InferenceDeployment(name=name, model="qwen", profile="p24",
                                                              replicas=1).model_dump_json())
    yield s
    s.close()


def test_a_hanging_deployment_does_not_hold_the_others_and_gpus_are_never_shared(store):
    agents = FakeAgents(Agent, active=set(), inside=set(), peak=0, overlap=False, done=[], deleted=[],
                        release=asyncio.Event())

    async def run():
        worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
        first = asyncio.create_task(worker.tick())
        await wait_for_async(lambda: len(agents.done) == len(NAMES) - 1, 4, "the others to finish while d0 hangs",
                             interval=0.01)
        assert sorted(agents.done) == NAMES[1:]
        second = asyncio.create_task(worker.tick())  # a second pass meets d0 still locked
        await asyncio.sleep(0.2)
        assert "d0" not in agents.done
        agents.release.set()
        await asyncio.gather(first, second)
        await worker.aclose()

    asyncio.run(run())
    assert agents.peak > 1 and agents.peak <= CONCURRENCY
    assert not agents.overlap, "two passes worked on one deployment at once"
    assert not agents.deleted
    owners = [json.loads(kv.value)["replica_id"] for kv in store.list(keyspace.gpu_reservations())]
    assert len(owners) == len(set(owners)) == len(NAMES)  # one GPU each, none shared
