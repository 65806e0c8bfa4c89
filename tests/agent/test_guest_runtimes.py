"""What the guest gets for each runtime, read the way the runtime or systemd reads it:
llama-server's -m file (a GGUF file by its magic), TensorRT-LLM's options YAML (yaml, as the LLM
API loads it) and its flags, the engine and share units (systemd-analyze verify), and the
vLLM LoRA ranks of the baked release."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.vm.base import VmSpec
from agent.vm.cloud_init import build_seed, gguf_file
from agent.vm.runtime_units import UNIT_NAME
from common.errors import InvalidInput
from common.runtimes import TRTLLM_CONFIG_PATH, runtime, vllm_lora_ranks


def seed(tmp_path: Path, runtime: str, **kw) -> dict:
    spec = VmSpec(replica_id="r-1", deployment="d", model_name="m-1", model_source="hf://org/model",
                  runtime=runtime, gpus=("0000:3b:00.0",), **kw)
    _, user = build_seed(spec, hostname="fabric-r-1", models_dir=tmp_path / "models")
    return {f["path"]: f["content"] for f in yaml.safe_load(user)["write_files"]}


def exec_argv(unit: str) -> list[str]:
    line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def model_dir(tmp_path: Path, *files: str, magic: bytes = b"GGUF") -> Path:
    d = tmp_path / "models/org/model"
    d.mkdir(parents=True, exist_ok=True)
    for name in files:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(magic + b"\x03\x00\x00\x00" + b"\0" * 24)
    return d


def test_llama_server_gets_the_gguf_file_of_the_share(tmp_path):
    d = model_dir(tmp_path, "model-Q4_K_M.gguf", "mmproj-model-f16.gguf", "README.md")
    argv = exec_argv(seed(tmp_path, "llama.cpp")[f"/etc/systemd/system/{UNIT_NAME}"])
    path = argv[argv.index("-m") + 1]
    host = d / path.removeprefix("/models/org/model/")  # the share maps /models to the models dir
    assert host.is_file() and host.read_bytes()[:4] == b"GGUF"  # what llama.cpp checks first


def test_split_models_load_from_their_first_part(tmp_path):
    d = model_dir(tmp_path, "big-00002-of-00003.gguf", "big-00001-of-00003.gguf", "big-00003-of-00003.gguf")
    assert gguf_file(d) == "big-00001-of-00003.gguf"


@pytest.mark.parametrize("files,magic,message", [
    ((), b"GGUF", "has none"),
    (("a-Q4.gguf", "a-Q8.gguf"), b"GGUF", "a-Q4.gguf, a-Q8.gguf"),
    (("a.gguf",), b"\x89HDF", "not a GGUF file"),
])
def test_llama_cpp_without_one_gguf_file_is_refused(tmp_path, files, magic, message):
    d = model_dir(tmp_path, *files, magic=magic)
    with pytest.raises(InvalidInput, match=message):
        gguf_file(d)
    with pytest.raises(InvalidInput, match="directory is not on this host"):
        gguf_file(None)


def test_trtllm_gets_its_metrics_options_yaml_and_only_options_it_lists(tmp_path):
    files = seed(tmp_path, "tensorrt-llm", max_model_len=4096)
    options = yaml.safe_load(files[TRTLLM_CONFIG_PATH])
    assert options == {"return_perf_metrics": True, "enable_iter_perf_stats": True}
    argv = exec_argv(files[f"/etc/systemd/system/{UNIT_NAME}"])
    assert argv[argv.index("--extra_llm_api_options") + 1] == TRTLLM_CONFIG_PATH
    assert "--served_model_name" not in argv
    assert {a for a in argv if a.startswith("--")} <= set(runtime("tensorrt-llm").flags())  # the bake's --help check


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_engine_and_share_units_verify_and_retry_instead_of_failing_once(tmp_path):
    files = seed(tmp_path, "vllm")
    engine = files[f"/etc/systemd/system/{UNIT_NAME}"]
    share = files["/etc/systemd/system/fabric-models.service"]
    directives = [line for line in engine.splitlines() if line and not line.startswith("#")]
    assert not [d for d in directives if d.startswith(("Requires=", "RequiresMountsFor=", "BindsTo="))]
    assert "ExecStartPre=/usr/bin/mountpoint -q /models" in engine and "StartLimitIntervalSec=0" in engine
    assert "Restart=on-failure" in share and "StartLimitIntervalSec=0" in share
    units = tmp_path / "units"
    units.mkdir()
    # The guest's binaries are not on this host: verify a copy whose ExecStart runs /bin/true.
    (units / UNIT_NAME).write_text(engine.replace("/opt/vllm/bin/vllm", "/bin/true"))
    (units / "fabric-models.service").write_text(share)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(units / UNIT_NAME),
                           str(units / "fabric-models.service")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_lora_ranks_follow_the_baked_vllm():
    from agent.models import adapter_sets
    from agent.vm.baked import baked_vllm_version

    assert vllm_lora_ranks("0.6.3.post1") == (8, 16, 32, 64, 128, 256)
    assert vllm_lora_ranks("0.8.5")[-2:] == (320, 512) and vllm_lora_ranks("0.10.0")[0] == 1
    assert adapter_sets.VLLM_RANKS == vllm_lora_ranks(baked_vllm_version())
    assert baked_vllm_version() == "0.32.0" and adapter_sets.VLLM_RANKS == (1, 8, 16, 32, 64, 128, 256, 320, 512)
