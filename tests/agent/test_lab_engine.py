"""The real engine's lab settings (agent/vm/lab_engine.py) that need no engine to check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.settings import LabEngineSettings
from agent.vm.lab_engine import pick_worker_cpu, real_engine_env, yield_cpu
from common.errors import InvalidInput
from lab.rigs.polling import wait_for


def test_each_replica_worker_gets_a_core_of_its_own_while_there_are_cores():
    allowed = [3, 1, 0, 2]
    taken: list[int] = []
    for _ in range(4):
        taken.append(pick_worker_cpu(taken, allowed))
    assert sorted(taken) == [0, 1, 2, 3]
    # then they share evenly, and a core freed by a replica that went is the next one taken
    assert pick_worker_cpu(taken, allowed) == 0
    assert pick_worker_cpu([0, 0, 2, 3], allowed) == 1
    with pytest.raises(InvalidInput, match="no CPU"):
        pick_worker_cpu([], [])


def test_the_engine_env_binds_its_worker_only_when_told(tmp_path):
    bound = real_engine_env(tmp_path / "a", lora=False, base={"PATH": "/usr/bin", "SECRET": "x"}, worker_cpu=1)
    assert bound["VLLM_CPU_OMP_THREADS_BIND"] == "1" and "SECRET" not in bound
    assert bound["TMPDIR"].startswith(str(tmp_path / "a")) and (tmp_path / "a" / "tmp").is_dir()
    auto = real_engine_env(tmp_path / "b", lora=True, base={})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in auto and auto["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_lab_engine_settings_refuse_what_they_cannot_run():
    with pytest.raises(InvalidInput, match="FABRIC_LAB_ENGINE must be one of"):
        LabEngineSettings.from_env({"FABRIC_LAB_ENGINE": "tgi"})
    with pytest.raises(InvalidInput, match="whole number of bytes"):
        LabEngineSettings.from_env({"FABRIC_LAB_ENGINE": "vllm", "FABRIC_LAB_ENGINE_KV_BYTES": "1G"})
    assert LabEngineSettings.from_env({"FABRIC_LAB_ENGINE": " VLLM "}).real_for("vllm")
    assert not LabEngineSettings.from_env({}).real_for("vllm")
    with pytest.raises(InvalidInput, match="FABRIC_LAB_ENGINE_NICE must be from 0 to 19"):
        LabEngineSettings.from_env({"FABRIC_LAB_ENGINE_NICE": "20"})
    with pytest.raises(InvalidInput, match="FABRIC_LAB_ENGINE_NICE must be a whole number"):
        LabEngineSettings.from_env({"FABRIC_LAB_ENGINE_NICE": "low"})
    assert LabEngineSettings.from_env({}).nice == 10 and LabEngineSettings.from_env({"FABRIC_LAB_ENGINE_NICE": "0"}).nice == 0


def test_an_engine_yields_the_cpu_with_its_session_and_the_children_it_starts_later():
    """As the lab driver starts it: a session of its own, then yield_cpu on its pid. The child it
    forks afterwards inherits the nice; the session's autogroup (where the kernel has them) gets
    it too, which is what the scheduler weighs against the gateway's session."""
    script = "import os, sys, time; sys.stdin.readline(); os.fork() or time.sleep(30); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, start_new_session=True)
    try:
        yield_cpu(proc.pid, 7)
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == 7
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        kids = wait_for(lambda: children.read_text().split(), 2, "the child process", interval=0.01)
        assert os.getpriority(os.PRIO_PROCESS, int(kids[0])) == 7
        group = Path(f"/proc/{proc.pid}/autogroup")
        if group.exists():
            assert group.read_text().split()[-1] == "7"
            assert Path(f"/proc/{kids[0]}/autogroup").read_text() == group.read_text()  # one session, one group
        else:
            print("this kernel has no autogroups: the process nice is all there is to check")
        before = os.getpriority(os.PRIO_PROCESS, 0)
        yield_cpu(os.getpid(), 0)  # 0 leaves a process alone
        assert os.getpriority(os.PRIO_PROCESS, 0) == before
    finally:
        proc.kill()
        proc.wait()
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)
