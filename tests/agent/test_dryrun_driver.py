"""The dry-run VM driver with real `fabric-engine-sim` processes on loopback."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from agent.vm.base import VmSpec
from agent.vm.dryrun_driver import DryRunDriver, default_engine_command, engine_argv
from lab.rigs.polling import wait_for


def spec(replica_id: str, **kw) -> VmSpec:
    return VmSpec(replica_id=replica_id, deployment="chat", model_name="tiny", model_source="/models/tiny", **kw)


def wait_state(driver: DryRunDriver, vm_id: str, want: str, timeout: float = 30):
    def reached():
        status = driver.get(vm_id)
        return status if status is not None and status.state == want else None

    return wait_for(reached, timeout, f"{vm_id} to be {want} (now {driver.get(vm_id)})", interval=0.05)


@pytest.fixture
def driver(tmp_path):
    d = DryRunDriver(tmp_path / "dry-run")
    yield d
    for vm in d.list():
        d.delete(vm.id)


def test_create_serves_the_model_and_delete_kills_the_engine(driver):
    status = wait_state(driver, driver.create(spec("tiny-0")).id, "running")
    models = httpx.get(f"http://{status.host}:{status.port}/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "tiny"
    pid = json.loads((driver.state_dir / "tiny-0.json").read_text())["pid"]
    assert driver.delete("tiny-0") is True
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
    assert driver.get("tiny-0") is None
    assert driver.delete("tiny-0") is False


def test_create_is_idempotent_by_replica_id(driver):
    first = driver.create(spec("tiny-1"))
    second = driver.create(spec("tiny-1"))
    assert (first.port, first.id) == (second.port, second.id)
    assert [s.id for s in driver.list()] == ["tiny-1"]


def test_a_restarted_agent_adopts_running_engines(driver, tmp_path):
    status = wait_state(driver, driver.create(spec("tiny-2")).id, "running")
    restarted = DryRunDriver(tmp_path / "dry-run")  # what a new agent process builds
    adopted = restarted.get("tiny-2")
    assert adopted.state == "running" and adopted.port == status.port
    assert restarted.create(spec("tiny-2")).port == status.port  # no second engine
    assert restarted.delete("tiny-2") is True
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{status.port}/health", timeout=2)


def test_a_dead_engine_reads_failed_and_create_starts_it_again(driver):
    status = wait_state(driver, driver.create(spec("tiny-3")).id, "running")
    pid = json.loads((driver.state_dir / "tiny-3.json").read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)
    failed = wait_state(driver, "tiny-3", "failed")
    assert str(pid) in failed.message
    again = wait_state(driver, driver.create(spec("tiny-3")).id, "running")
    assert json.loads((driver.state_dir / "tiny-3.json").read_text())["pid"] != pid
    assert again.port != 0 and status.id == again.id


def test_a_reused_pid_is_not_adopted_nor_killed(tmp_path):
    # A record pointing at a live process that is not our engine (this test process).
    state = tmp_path / "dry-run"
    state.mkdir()
    (state / "ghost-0.json").write_text(json.dumps({
        "replica_id": "ghost-0", "pid": os.getpid(), "host": "127.0.0.1", "port": 1,
        "argv": ["fabric-engine-sim"], "started_at": 0}))
    d = DryRunDriver(state)
    assert d.get("ghost-0").state == "failed"
    assert d.delete("ghost-0") is True  # record removed; we are still alive to assert it
    assert d.get("ghost-0") is None


def test_engine_argv_turns_knobs_into_flags():
    argv = engine_argv(["sim"], spec("r-1", max_model_len=4096,
                                     engine_args={"tokens_per_s": "50", "legacy_metric_names": "true",
                                                  "fail_health": "false"}), "127.0.0.1", 8123)
    assert argv[:9] == ["sim", "--host", "127.0.0.1", "--port", "8123", "--model", "tiny", "--replica-id", "r-1"]
    assert argv[9:] == ["--max-model-len", "4096", "--legacy-metric-names", "--tokens-per-s", "50"]


def test_default_engine_command_finds_the_console_script():
    cmd = default_engine_command()
    assert cmd[0].endswith("fabric-engine-sim") or cmd[-1] == "enginesim.cli"


def test_engine_argv_names_the_runtime_so_health_and_metrics_match_it():
    assert "--runtime" not in engine_argv(["sim"], spec("r-1"), "127.0.0.1", 8123)
    argv = engine_argv(["sim"], spec("r-1", runtime="llama.cpp"), "127.0.0.1", 8123)
    assert argv[argv.index("--runtime") + 1] == "llama.cpp"
