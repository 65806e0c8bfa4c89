"""A GPU bind and a VM create slower than fabricd's per-request timeout: the reconciler starts
each as an agent operation and polls it, so the slow but healthy work is done once, never timed
out and retried. The real agent app serves on loopback over a fake binder and VM driver whose
calls take several times the client's timeout; fabricd's real ReconcileWorker and AgentClient
call it."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from agent.api import create_app
from agent.state import AgentState
from agent.vm.base import VmStatus
from common import keyspace
from common.agent_api import VmCreateRequest
from common.errors import TransientError
from common.schemas import InferenceDeployment
from common.store.sqlite_store import SqliteStore
from controlplane.agent_client import AgentClient
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from lab.rigs.servers import serve_in_thread
from tests.controlplane.planner_data import gpu, model, node, profile

CLIENT_TIMEOUT_S = 1.0  # each request fabricd makes
WORK_S = 3.0  # each bind and create: three times the request timeout


class SlowBinder:
    def __init__(self, delay: float):
        self.delay, self.calls, self.bound = delay, [], set()

    def bind(self, bdf):
        self.calls.append(("bind", bdf))
        time.sleep(self.delay)
        self.bound.add(bdf)
        return {"functions": [bdf]}

    def release(self, bdf):
        self.calls.append(("release", bdf))
        self.bound.discard(bdf)
        return {"functions": [bdf]}

    def status(self, bdf):
        return "vfio-pci" if bdf in self.bound else "nvidia"


class SlowDriver:
    name = "slow"

    def __init__(self, delay: float):
        self.delay, self.creates, self.vms = delay, [], {}
        self.go = threading.Event()
        self.go.set()

    def create(self, spec):
        self.creates.append(spec.replica_id)
        time.sleep(self.delay)
        self.go.wait(30)
        self.vms[spec.replica_id] = VmStatus(spec.replica_id, "running", "127.0.0.1", spec.port)
        return self.vms[spec.replica_id]

    def get(self, vm_id):
        return self.vms.get(vm_id)

    def list(self):
        return list(self.vms.values())

    def delete(self, vm_id):
        return self.vms.pop(vm_id, None) is not None


class Inventory:
    def read(self):
        return type("Inv", (), {"gpus": [gpu(0), gpu(1)], "message": ""})()


class Agents:
    def __init__(self, url: str, **client):
        self.url, self.client, self.made = url, client, []

    def for_node(self, n):
        c = AgentClient(self.url, timeout=CLIENT_TIMEOUT_S, poll_s=(0.05, 0.2), **self.client)
        self.made.append(c)
        return c


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "fabric.db")
    s.put(keyspace.models("qwen"), model().model_dump_json())
    s.put(keyspace.profiles("p24"), profile().model_dump_json())
    s.put(keyspace.nodes("n1"), node("n1", 2).model_copy(update={"last_heartbeat": time.time() + 600,
                                                             "address": "http://127.0.0.1:7443"})
          .model_dump_json())
    s.put(keyspace.deployments("qwen"), InferenceDeployment(name="qwen", model="qwen", profile="p24",
                                                            replicas=1).model_dump_json())
    yield s
    s.close()


def _replicas(store):
    return [json.loads(kv.value) for kv in store.list(keyspace.replicas())]


async def _tick(worker, agents):
    await worker.tick()
    for c in agents.made:
        await c.aclose()
    agents.made.clear()


def test_slow_bind_and_create_are_awaited_once_and_the_replica_starts(store):
    binder, driver = SlowBinder(WORK_S), SlowDriver(WORK_S)
    state = AgentState(node_id="n1", vm_driver=driver, inventory=Inventory(), binder=binder)
    with serve_in_thread(create_app(state)) as port:
        agents = Agents(f"http://127.0.0.1:{port}")

        async def run():
            worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
            await _tick(worker, agents)
            await worker.aclose()
            return worker

        worker = asyncio.run(run())
    (rep,) = _replicas(store)
    assert rep["phase"] == "Starting" and rep["vm_id"] == rep["replica_id"], rep.get("message")
    assert rep["host"] == "127.0.0.1" and "timed out" not in rep.get("message", "")
    assert driver.creates == [rep["replica_id"]]  # exactly once: no timeout, no retry
    assert binder.calls == [("bind", pci) for pci in rep["gpus"]]
    assert worker.backoff.get("n1") is None  # nothing counted as an agent failure


def test_past_its_deadline_the_next_pass_joins_the_running_create(store):
    """fabricd's own deadline for a kind can pass (here set far below the work): the pass reports
    a transient wait, and the next pass joins the operation still running on the agent."""
    driver = SlowDriver(0.0)
    driver.go.clear()  # the create runs until the test lets it finish
    # No binder: a bind would wait for the driver lock the blocked create holds (one lock per agent).
    app = create_app(AgentState(node_id="n1", vm_driver=driver, inventory=Inventory()))
    with serve_in_thread(app) as port:
        agents = Agents(f"http://127.0.0.1:{port}", deadlines={"vm-create": 1.5})

        async def run():
            worker = ReconcileWorker(store, agents, rp.ReconcileSettings())
            await _tick(worker, agents)
            (first,) = _replicas(store)
            assert "still running after 1.5s" in first["message"] and first.get("vm_id") is None, first
            worker.backoff.succeeded("n1")  # skip the backoff pause: the agent is healthy
            agents.client["deadlines"] = {"vm-create": 60.0}
            threading.Timer(2.0, driver.go.set).start()  # the create ends while the second pass waits
            await _tick(worker, agents)
            await worker.aclose()

        asyncio.run(run())
        creates = [op for op in app.state.operations._ops.values() if op.kind == "vm-create"]
    (rep,) = _replicas(store)
    assert rep["phase"] == "Starting" and rep["vm_id"] == rep["replica_id"], rep.get("message")
    assert driver.creates == [rep["replica_id"]]  # the second pass joined the first create
    assert len(creates) == 1 and creates[0].state == "succeeded"


def test_an_operation_the_agent_lost_is_a_transient_error():
    """After an agent restart the operation id is unknown: the client says so as a transient error
    (the next pass starts the verb again, which the drivers make idempotent)."""
    driver = SlowDriver(0.0)
    driver.go.clear()
    app = create_app(AgentState(node_id="n1", vm_driver=driver, inventory=Inventory()))
    with serve_in_thread(app) as port:

        async def run():
            client = AgentClient(f"http://127.0.0.1:{port}", timeout=CLIENT_TIMEOUT_S, poll_s=(0.05, 0.05))
            try:
                create = asyncio.create_task(client.create_vm(VmCreateRequest(
                    replica_id="r-1", deployment="d", model_name="m", model_source="/models/m")))
                while not driver.creates:
                    await asyncio.sleep(0.02)
                app.state.operations._ops.clear()  # what a restarted agent knows of its operations
                app.state.operations._running.clear()
                with pytest.raises(TransientError, match="no longer knows operation vm-create-"):
                    await create
            finally:
                driver.go.set()
                await client.aclose()

        asyncio.run(run())
