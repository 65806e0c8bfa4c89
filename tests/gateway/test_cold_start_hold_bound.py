"""gateway.cold_start's hold bound: by default a call at zero replicas is held for its runtime's
start budget (common.runtimes), so an endpoint whose runtime starts slower holds longer; the
endpoint's hold_secs, then FABRIC_GATEWAY_HOLD_SECS, override it. The hold reads the suite's fake
clock (tests/support/fake_clock.py): the test moves it past each bound, nothing waits one out."""

from __future__ import annotations

import asyncio

import pytest

from common import keyspace
from common.errors import TransientError
from common.runtimes import RUNTIME_TABLE
from common.schemas import (
    AutoscalingSpec,
    DeploymentStatus,
    EndpointStatus,
    GpuRequest,
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
)
from common.store.sqlite_store import SqliteStore
from gateway.cold_start import ColdStart, ModelLoading, hold_bound
from gateway.hold import HoldPolicy
from lab.rigs.polling import wait_for_async
from tests.support.fake_clock import START, FakeClock

VLLM, TRTLLM = RUNTIME_TABLE["vllm"].start_budget_s, RUNTIME_TABLE["tensorrt-llm"].start_budget_s


class NoReadyReplica:
    """The gateway's upstream cache for endpoints whose replicas are all still starting."""

    async def view(self, endpoint: str):
        raise TransientError(f"endpoint {endpoint!r} has no ready replica", code="no_ready_replica")


def parked(store, name: str, runtime: str, hold_secs: float | None = None) -> None:
    """An endpoint whose deployment (on a profile of ``runtime``) is scaled to zero and wakes on demand."""
    store.put(keyspace.profiles(f"{name}-p"), InferenceProfile(
        name=f"{name}-p", runtime=runtime, gpu=GpuRequest(count=1, vram_gib=24), cpu=4, memory_gib=16).model_dump_json())
    store.put(keyspace.deployments(f"{name}-d"), InferenceDeployment(
        name=f"{name}-d", model="m", profile=f"{name}-p", replicas=0,
        autoscaling=AutoscalingSpec(min_replicas=0, scale_to_zero=True),
        status=DeploymentStatus(phase="Ready")).model_dump_json())
    store.put(keyspace.endpoints(name), InferenceEndpoint(
        name=name, deployment=f"{name}-d", status=EndpointStatus(phase="Ready"), hold_secs=hold_secs).model_dump_json())


async def settle(done) -> None:
    """Let the held calls' tasks run until ``done()``."""
    await wait_for_async(done, 2.5, "the held calls to reach the expected state", interval=0.005)


def test_a_runtime_with_a_longer_start_budget_holds_longer_by_default(tmp_path):
    assert TRTLLM > VLLM
    store = SqliteStore(tmp_path / "state.db")
    parked(store, "chat", "vllm")
    parked(store, "trt", "tensorrt-llm")
    parked(store, "own", "tensorrt-llm", hold_secs=30)  # the endpoint's own setting wins
    clock = FakeClock(tmp_path / "now")

    async def main():
        cold = ColdStart(store, NoReadyReplica(), clock=clock, monotonic=clock, poll_s=0.005)  # type: ignore[arg-type]
        notes: dict[str, dict] = {"chat": {}, "trt": {}, "own": {}}
        calls = {name: asyncio.create_task(cold.view(name, "tenant", None, notes[name])) for name in notes}
        await settle(lambda: len(cold.room.wakes) == 3)

        def ended() -> set[str]:
            return {name for name, call in calls.items() if call.done()}

        clock.now = START + 31
        await settle(lambda: ended() == {"own"})
        clock.now = START + VLLM - 1
        await asyncio.sleep(0.05)  # a few of the wake's polls: nobody else is due
        assert ended() == {"own"}
        clock.now = START + VLLM + 1
        await settle(lambda: ended() == {"own", "chat"})
        clock.now = START + TRTLLM - 1
        await asyncio.sleep(0.05)
        assert ended() == {"own", "chat"}
        clock.now = START + TRTLLM + 1
        await settle(lambda: ended() == {"own", "chat", "trt"})
        for call in calls.values():
            with pytest.raises(ModelLoading):
                call.result()
        assert cold.room.wakes == {} and cold.room.tenants == {}  # every place given back
        return notes

    notes = asyncio.run(main())
    assert {name: n["cold_start"]["hold_bound_s"] for name, n in notes.items()} == {
        "chat": VLLM, "trt": TRTLLM, "own": 30}


def test_the_gateway_setting_overrides_the_runtime_budget(tmp_path):
    store = SqliteStore(tmp_path / "state.db")
    parked(store, "trt", "tensorrt-llm")
    clock = FakeClock(tmp_path / "now")

    async def main():
        cold = ColdStart(store, NoReadyReplica(), hold=HoldPolicy(secs=45), clock=clock, monotonic=clock,  # type: ignore[arg-type]
                         poll_s=0.005)
        notes: dict = {}
        call = asyncio.create_task(cold.view("trt", "tenant", None, notes))
        await settle(lambda: bool(cold.room.wakes))
        clock.now = START + 46
        await settle(call.done)
        with pytest.raises(ModelLoading):
            call.result()
        return notes

    assert asyncio.run(main())["cold_start"]["hold_bound_s"] == 45


@pytest.mark.parametrize("endpoint,gateway,runtime,bound", [
    (None, None, "vllm", VLLM),
    (None, None, "tensorrt-llm", TRTLLM),
    (None, None, "llama.cpp", RUNTIME_TABLE["llama.cpp"].start_budget_s),
    (None, None, None, VLLM),  # the profile is gone: vLLM's
    (None, None, "a-newer-runtime", VLLM),
    (None, 45, "tensorrt-llm", 45),  # FABRIC_GATEWAY_HOLD_SECS
    (30, 45, "tensorrt-llm", 30),  # the endpoint's hold_secs
    (0, None, "tensorrt-llm", 0),  # never held
    (None, 0, "tensorrt-llm", 0),
])
def test_hold_bound(endpoint, gateway, runtime, bound):
    assert hold_bound(endpoint, gateway, runtime) == bound
