"""Each runtime's guest unit, rendered from the one table in common/runtimes.py."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import pytest
import yaml

from agent.vm.base import VmSpec
from agent.vm.cloud_init import build_seed, images_dir
from agent.vm.runtime_units import UNIT_NAME, render_unit
from common.errors import InvalidInput
from common.runtimes import RUNTIME_NAMES, RUNTIME_TABLE, VLLM_KV_EVENTS_CONFIG

GPUS = ("0000:3b:00.0", "0000:3c:00.0")


def exec_argv(unit: str) -> list[str]:
    line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


MODELS = Path(tempfile.mkdtemp(prefix="fabric-models-"))  # hf://org/model as the agent's cache lays it out
(MODELS / "org/model").mkdir(parents=True)
(MODELS / "org/model/model-Q4_K_M.gguf").write_bytes(b"GGUF" + b"\0" * 60)


def seed_unit(runtime: str, **kw) -> tuple[str, dict]:
    spec = VmSpec(replica_id="r-1", deployment="d", model_name="m-1", model_source="hf://org/model",
                  runtime=runtime, gpus=GPUS, **kw)
    _, user = build_seed(spec, hostname="fabric-r-1", models_dir=MODELS)
    config = yaml.safe_load(user)
    unit = next(f for f in config["write_files"] if f["path"] == f"/etc/systemd/system/{UNIT_NAME}")
    return unit["content"], config


EXPECTED = {
    "vllm": ["/opt/vllm/bin/vllm", "serve", "/models/org/model", "--served-model-name", "m-1", "--host",
             "0.0.0.0", "--port", "8000", "--kv-events-config", VLLM_KV_EVENTS_CONFIG,
             "--shutdown-timeout", "30", "--tensor-parallel-size", "2"],
    "tensorrt-llm": ["/opt/trtllm/bin/trtllm-serve", "serve", "/models/org/model", "--host", "0.0.0.0", "--port",
                     "8000", "--extra_llm_api_options", "/etc/fabric/trtllm-config.yaml", "--tp_size", "2"],
    "llama.cpp": ["/opt/llama.cpp/bin/llama-server", "-m", "/models/org/model/model-Q4_K_M.gguf", "--alias", "m-1",
                  "--host", "0.0.0.0", "--port", "8000", "--metrics", "-ngl", "999"],
    "tei": ["/opt/tei/bin/text-embeddings-router", "--model-id", "/models/org/model", "--served-model-name", "m-1",
            "--hostname", "0.0.0.0", "--port", "8000", "--prometheus-port=9000"],
}


@pytest.mark.parametrize("runtime", [r for r in RUNTIME_NAMES if r != "triton"])
def test_each_runtime_gets_its_own_command_line_on_port_8000(runtime):
    unit, config = seed_unit(runtime)
    assert exec_argv(unit) == EXPECTED[runtime]
    assert f"runtime {runtime}" in unit
    assert f"User={RUNTIME_TABLE[runtime].service_user}" in unit
    assert ["systemctl", "enable", "--now", UNIT_NAME] in config["runcmd"]


@pytest.mark.parametrize("runtime", [r for r in RUNTIME_NAMES if r != "triton"])
def test_the_engine_output_goes_to_the_console_the_agent_serves_as_the_replica_log(runtime):
    """systemd sends a unit's output to the journal only unless told; the console is ttyS0, which
    libvirt copies to the engine log behind `fabricctl ai logs` and explain failure (the boot of a
    refusing engine is tests/agent/test_vm_boot.py's full test)."""
    unit, _ = seed_unit(runtime)
    service = unit.split("[Service]", 1)[1].split("[Install]", 1)[0].splitlines()
    assert "StandardOutput=journal+console" in service and "StandardError=journal+console" in service


def test_every_known_runtime_is_in_the_table():
    from common.schemas import RUNTIMES

    assert set(RUNTIMES) == set(RUNTIME_NAMES) == set(EXPECTED) | {"triton"}


@pytest.mark.parametrize("runtime,flag", [("vllm", "--max-model-len"), ("tensorrt-llm", "--max_seq_len"),
                                          ("llama.cpp", "--ctx-size")])
def test_context_length_uses_the_runtime_flag(runtime, flag):
    argv = exec_argv(seed_unit(runtime, max_model_len=8192)[0])
    assert argv[argv.index(flag) + 1] == "8192"


def test_context_length_is_refused_where_the_runtime_has_no_flag():
    with pytest.raises(InvalidInput, match="context-length"):
        seed_unit("tei", max_model_len=8192)


def test_triton_behind_an_openai_endpoint_is_refused_with_the_reason():
    with pytest.raises(InvalidInput, match="KServe v2 API .* not OpenAI /v1"):
        seed_unit("triton")


def test_tensor_parallel_follows_the_gpu_count_only_where_the_runtime_has_it():
    one = exec_argv(render_unit(images_dir(), "vllm", model_path="/models/x", served_name="x", port=8000,
                                tensor_parallel=1))
    assert one[one.index("--tensor-parallel-size") + 1] == "1"
    for runtime in ("triton", "llama.cpp", "tei"):
        argv = exec_argv(render_unit(images_dir(), runtime, model_path="/models/x", served_name="x", port=8000,
                                     tensor_parallel=4))
        assert "4" not in argv


def test_odd_model_paths_stay_one_argument():
    unit = render_unit(images_dir(), "llama.cpp", model_path="/models/a b/@USER@ {port}.gguf", served_name="x",
                       port=8000, tensor_parallel=1, extra_args=("--threads", "4"))
    argv = exec_argv(unit)
    assert argv[argv.index("-m") + 1] == "/models/a b/@USER@ {port}.gguf"
    assert argv[-2:] == ["--threads", "4"]


@pytest.mark.parametrize("runtime", RUNTIME_NAMES)
def test_credential_flags_are_refused_for_every_runtime(runtime):
    with pytest.raises(InvalidInput, match="--hf-token"):
        render_unit(images_dir(), runtime, model_path="/models/x", served_name="x", port=8000, tensor_parallel=1,
                    extra_args=("--hf-token=hf_abcdefgh",))
