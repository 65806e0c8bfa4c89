"""A model the engine cannot load: the replica's probe gets no answer, its agent reports the VM
(engine process) failed, and the reconciler makes it Failed with the engine's own last error
line from its log, releases its GPU and counts the failure (not an endless restart)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from common import keyspace
from common.agent_api import GpuBindResult, VmInfo
from common.records.events import recent_events
from common.schemas import Replica
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from tests.controlplane.reconcile_support import seeded_store
from tests.support.fake_agents import FakeAgents

LOG = ("INFO 12-01 loading model\nTraceback (most recent call last):\n  File \"vllm/config.py\", line 1\n"
       "OSError: /models does not appear to have a file named config.json\n"
       "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
GPU = "0000:10:00.0"


class Agent:
    def __init__(self, calls):
        self.calls = calls

    async def list_vms(self):
        self.calls.append(("list_vms",))
        return [VmInfo(id="qwen-0-aaaaaa", state="failed", host="127.0.0.1", port=9, message="engine process exited")]

    async def vm_logs(self, vm_id, offset, limit):
        self.calls.append(("logs", offset))
        return {"text": LOG, "offset": 0, "next_offset": len(LOG), "size": len(LOG)}

    async def delete_vm(self, vm_id):
        self.calls.append(("delete_vm", vm_id))
        return True

    async def release_gpu(self, pci):
        self.calls.append(("release", pci))
        return GpuBindResult(bdf=pci, changed=True)

    async def bind_gpu(self, pci):
        return GpuBindResult(bdf=pci, changed=False)

    async def create_vm(self, req):
        self.calls.append(("create_vm", req.replica_id))
        return VmInfo(id=req.replica_id, state="running", host="127.0.0.1", port=9)


@pytest.fixture
def store(tmp_path):
    s = seeded_store(tmp_path, address="https://127.0.0.1:7443")
    r = Replica(replica_id="qwen-0-aaaaaa", deployment="qwen", ordinal=0, node="n1", gpus=[GPU], host="127.0.0.1",
                port=9, phase="Starting", created_at=time.time())
    s.put(keyspace.replicas("qwen", r.replica_id), r.model_dump_json())
    s.put(keyspace.gpu_reservations("n1", GPU), json.dumps({"replica_id": r.replica_id, "deployment": "qwen"}))
    yield s
    s.close()


def test_the_engines_own_error_line_fails_the_replica_and_frees_its_gpu(store):
    agents = FakeAgents(lambda pool: Agent(pool.calls))

    async def run():
        worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
        await worker.tick()
        await worker.aclose()

    asyncio.run(run())
    line = "OSError: /models does not appear to have a file named config.json"
    assert ("delete_vm", "qwen-0-aaaaaa") in agents.calls and ("release", GPU) in agents.calls
    assert store.get(keyspace.replicas("qwen", "qwen-0-aaaaaa")) is None
    failed = [e for e in recent_events(store, 100, name="qwen-0-aaaaaa") if e.reason == "ReplicaFailed"]
    assert failed and failed[-1].type == "Warning" and failed[-1].message == f"qwen: engine exited: {line}"
    status = json.loads(store.get(keyspace.deployments("qwen")).value)["status"]
    assert status["failures"] == 1 and line in status["last_failure"]
    creates = [c for c in agents.calls if c[0] == "create_vm"]
    assert len(creates) == 1  # the first failure is replaced at once; the count decides the next ones


def test_a_pass_asks_each_node_for_its_vms_once_whatever_its_replicas_and_deployments(store):
    """Replicas of two deployments on one node, none answering its probe: one GET /v1/vms for the
    node in the pass, not one call per replica (a fleet whose health reports went stale together
    would otherwise be asked one replica after another)."""
    dep = json.loads(store.get(keyspace.deployments("qwen")).value)
    store.put(keyspace.deployments("qwen2"), json.dumps(dep | {"name": "qwen2"}))
    for name, rid in (("qwen", "qwen-1-bbbbbb"), ("qwen2", "qwen2-0-cccccc"), ("qwen2", "qwen2-1-dddddd")):
        r = Replica(replica_id=rid, deployment=name, ordinal=int(rid.split("-")[1]), node="n1", gpus=[GPU],
                    host="127.0.0.1", port=9, phase="Starting", created_at=time.time())
        store.put(keyspace.replicas(name, rid), r.model_dump_json())
    agents = FakeAgents(lambda pool: Agent(pool.calls))

    async def run():
        worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
        await worker.tick()
        first = agents.calls.count(("list_vms",))
        await worker.tick()
        await worker.aclose()
        return first

    assert asyncio.run(run()) == 1
    assert agents.calls.count(("list_vms",)) == 2  # the next pass asks again: its own snapshot
    assert ("delete_vm", "qwen-0-aaaaaa") in agents.calls  # the one the list calls failed
    assert ("delete_vm", "qwen2-0-cccccc") not in agents.calls  # not listed: the health rules decide
