"""The real engine's lab settings (agent/vm/lab_engine.py) that need no engine to check."""

from __future__ import annotations

import pytest

from agent.vm.lab_engine import LabEngineSettings, pick_worker_cpu, real_engine_env
from common.errors import InvalidInput


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
