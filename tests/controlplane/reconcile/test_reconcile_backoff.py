"""Unreachable agents: the per-node backoff schedule (pure) and the reconciler honouring it on a
real SQLite store with a fake clock, so no test waits for the delays."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from common import keyspace
from common.agent_api import GpuBindResult, VmInfo
from common.errors import Refused, TransientError
from common.store.sqlite_store import SqliteStore
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from controlplane.reconcile.backoff import (
    AgentBackoff,
    BackoffAgent,
    after_failure,
    backoff_delay,
    is_due,
)
from tests.controlplane.planner_data import deployment, model, node, profile
from tests.support.fake_agents import FakeAgents

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.mark.parametrize(("failures", "delay"), [
    (0, 0), (1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 32), (7, 60), (8, 60), (100, 60), (5000, 60),
])
def test_schedule_doubles_from_one_second_and_caps_at_sixty(failures, delay):
    assert backoff_delay(failures) == delay


def test_schedule_takes_its_base_and_cap():
    assert [backoff_delay(n, base=0.5, cap=3) for n in range(1, 6)] == [0.5, 1, 2, 3, 3]


def test_transitions_and_message():
    first = after_failure(None, "gpu-7", "agent https://10.0.0.7:9443 unreachable for POST /v1/vms: ConnectError", T0)
    assert (first.failures, first.delay_s, first.next_try_at) == (1, 1, T0 + 1)
    assert not is_due(first, T0 + 0.5) and is_due(first, T0 + 1) and is_due(None, T0)
    third = after_failure(after_failure(first, "gpu-7", "timeout", T0 + 1), "gpu-7", "timeout", T0 + 3)
    assert (third.failures, third.delay_s, third.next_try_at) == (3, 4, T0 + 7)
    assert first.message == ("agent on gpu-7 unreachable (1 try failed, last: agent https://10.0.0.7:9443 "
                             "unreachable for POST /v1/vms: ConnectError); next try at 22:13:21Z (backoff 1s)")
    assert "3 tries in a row failed, last: timeout" in third.message and "22:13:27Z (backoff 4s)" in third.message


def test_table_resets_on_success_and_reports_only_future_retries():
    now = [T0]
    table = AgentBackoff(clock=lambda: now[0])
    assert table.waiting("n1") is None and table.next_try_at() is None
    table.failed("n1", "x")
    table.failed("n1", "x")
    assert table.waiting("n1").failures == 2 and table.next_try_at() == T0 + 2
    now[0] += 2
    assert table.waiting("n1") is None  # due: may be tried
    assert table.next_try_at() is None  # nothing ahead to wake up for
    table.succeeded("n1")
    assert table.failed("n1", "x").delay_s == 1  # a success started the schedule over


class FlakyAgent:
    def __init__(self, owner):
        self.owner = owner

    async def _maybe_fail(self, what):
        self.owner.calls.append(what)
        if self.owner.down:
            raise TransientError(f"agent https://n1:7443 unreachable for {what}: ConnectError")
        if self.owner.refuse:
            raise Refused("agent: no such GPU")

    async def bind_gpu(self, pci):
        await self._maybe_fail("bind")
        return GpuBindResult(bdf=pci, changed=False)

    async def create_vm(self, req):
        await self._maybe_fail("create_vm")
        return VmInfo(id=req.replica_id, state="running", host="127.0.0.1", port=self.owner.port)


def flaky_agents() -> FakeAgents:
    """Agents that are down until the test says otherwise; their VMs answer on a closed port."""
    with socket.socket() as s:  # a closed port: health probes fail fast
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return FakeAgents(FlakyAgent, down=True, refuse=False, port=port)


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "fabric.db")
    s.put(keyspace.models("qwen"), model().model_dump_json())
    s.put(keyspace.profiles("p24"), profile().model_dump_json())
    # The fake agent's VMs answer on loopback, which only an agent on loopback may report (node_trust).
    s.put(keyspace.nodes("n1"), node("n1", 2).model_copy(update={"last_heartbeat": T0 + 3600,
                                                                 "address": "https://127.0.0.1:7443"}).model_dump_json())
    s.put(keyspace.deployments("qwen"), deployment(1).model_dump_json())
    yield s
    s.close()


def status(store) -> dict:
    return json.loads(store.get(keyspace.deployments("qwen")).value)["status"]


def test_an_unreachable_agent_leaves_the_deployment_pending_with_growing_backoff(store):
    now = [T0]
    agents = flaky_agents()
    worker = ReconcileWorker(store, agents, rp.ReconcileSettings(), clock=lambda: now[0])

    async def run():
        async def tick_at(t):
            now[0] = T0 + t
            await worker.tick()

        await tick_at(0)
        assert agents.calls == ["bind"]
        st = status(store)
        assert st["phase"] == "Pending"
        assert "agent on n1 unreachable (1 try failed, last: agent https://n1:7443 unreachable for bind" in st["message"]
        assert "next try at 22:13:21Z (backoff 1s)" in st["message"]
        assert worker.next_retry_at() == T0 + 1
        [rec] = store.list(keyspace.replicas())
        assert "waiting: agent on n1 unreachable" in json.loads(rec.value)["message"]
        revision = store.revision()

        await tick_at(0.5)  # inside the wait: the agent is not called and nothing changes
        assert agents.calls == ["bind"]
        assert status(store) == st and store.revision() == revision
        assert len(store.list(keyspace.replicas())) == 1 and len(store.list(keyspace.gpu_reservations())) == 1

        await tick_at(1)
        assert agents.calls == ["bind"] * 2
        assert "2 tries in a row failed" in status(store)["message"] and "(backoff 2s)" in status(store)["message"]
        await tick_at(2)  # 1 s into a 2 s wait
        assert len(agents.calls) == 2
        await tick_at(3)
        assert len(agents.calls) == 3 and "next try at 22:13:27Z (backoff 4s)" in status(store)["message"]
        for _ in range(6):  # keep failing: the wait stops growing at 60 s
            await tick_at(worker.next_retry_at() - T0)
        assert worker.backoff.get("n1").delay_s == 60 and "(backoff 60s)" in status(store)["message"]
        assert len(store.list(keyspace.replicas())) == 1  # still one replica, no duplicates

        agents.down = False
        await tick_at(worker.next_retry_at() - T0)
        assert agents.calls[-2:] == ["bind", "create_vm"]
        assert worker.backoff.get("n1") is None and worker.next_retry_at() is None  # reset on success
        st = status(store)
        assert "unreachable" not in st["message"] and st["phase"] == "Progressing"
        rep = json.loads(store.list(keyspace.replicas())[0].value)
        assert rep["phase"] == "Starting" and rep["host"] == "127.0.0.1"
        await worker.aclose()

    asyncio.run(run())


def test_an_answer_from_the_agent_resets_it_and_only_transient_errors_count():
    now = [T0]
    agents = flaky_agents()
    table = AgentBackoff(clock=lambda: now[0])
    agent = BackoffAgent(FlakyAgent(agents), "n1", table)

    async def run():
        with pytest.raises(TransientError, match="1 try failed"):
            await agent.bind_gpu("0000:10:00.0")
        with pytest.raises(TransientError, match="next try at") as waiting:
            await agent.bind_gpu("0000:10:00.0")  # not contacted while waiting
        assert waiting.value.code == "agent_backoff" and agents.calls == ["bind"]
        now[0] += 1
        agents.down, agents.refuse = False, True
        with pytest.raises(Refused):  # the agent answered (4xx): reachable, the wait is over
            await agent.bind_gpu("0000:10:00.0")
        assert table.get("n1") is None

    asyncio.run(run())
