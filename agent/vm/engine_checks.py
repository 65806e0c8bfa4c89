"""What the bake checks against the engine it installs, and `make test` against the lab's engine:
images/guest/engine-args.json, written from the code that writes the guest unit.

  vllm_argvs     every kind of command line Fabric's guest unit gives vLLM (after the binary):
                 one GPU; tensor parallel; tensor + pipeline parallel; a context length; LoRA
                 at the smallest and largest rank the baked vLLM accepts; the profile flags
                 below. Each is rendered by cloud_init.render_engine_unit (the unit text a guest
                 gets) and its ExecStart split as systemd splits it. They are parsed by vLLM's
                 own argument parser (images/guest/check-vllm-args.py): in the bake with the vLLM
                 it installed, in `make test` with the lab's (.venv-engine), which is the same
                 version (images/guest/versions.env; tests/agent/test_engine_version.py).
  help_options   for every other runtime, the option names Runtime.flags lists; the bake finds
                 each in the installed engine's --help (images/guest/install-guest.sh).

A profile's extra_args and a deployment's engine_args are free text that Fabric passes through;
PROFILE_FLAGS are the ones Fabric's docs and examples use, checked so a renamed flag is seen.

`python -m agent.vm.engine_checks` rewrites the file; tests/agent/test_engine_args.py fails
while the committed file differs from what the code renders.
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path

from agent.vm import cloud_init
from agent.vm.base import VmSpec
from common.runtimes import OPENAI_INCAPABLE, RUNTIME_TABLE, vllm_lora_ranks

CHECKS_FILE = "guest/engine-args.json"  # under images/
# Flags profiles and deployments pass through extra_args / engine_args in Fabric's docs and tests.
PROFILE_FLAGS = ("--quantization", "fp8", "--kv-cache-dtype", "fp8", "--dtype", "bfloat16",
                 "--gpu-memory-utilization", "0.9", "--max-num-seqs", "64", "--enable-prefix-caching",
                 "--enable-chunked-prefill", "--generation-config", "vllm", "--trust-remote-code")
# 8 heads (agent.vm.parallelism): 2 GPUs are TP 2, 3 GPUs PP 3, 6 GPUs TP 2 x PP 3.
_CONFIG = {"num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 24}


def exec_start_argv(unit: str) -> list[str]:
    """ExecStart's argv in a rendered unit, split as systemd splits it (shlex quoting)."""
    lines = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    if len(lines) != 1:
        raise ValueError(f"the unit has {len(lines)} ExecStart= lines, expected 1")
    return shlex.split(lines[0].removeprefix("ExecStart="))


def vllm_specs(work: Path, baked_version: str) -> list[VmSpec]:
    """One spec per kind of vLLM command line; the model directory and adapter folder under ``work``."""
    model = work / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(_CONFIG))
    adapters = work / "adapters"
    adapters.mkdir(exist_ok=True)
    ranks = vllm_lora_ranks(baked_version)
    gpu = tuple(f"0000:0{i}:00.0" for i in range(6))

    def spec(name: str, **kw) -> VmSpec:
        return VmSpec(replica_id=f"check-{name}", deployment="check", model_name="check-model",
                      model_source="hf://org/check", model_dir=str(model), **kw)

    return [
        spec("one-gpu", gpus=gpu[:1]),
        spec("tensor-parallel", gpus=gpu[:2]),
        spec("pipeline", gpus=gpu[:3], max_model_len=8192),
        spec("tensor-and-pipeline", gpus=gpu[:6]),
        spec("lora-low", gpus=gpu[:1], adapters_dir=str(adapters), max_loras=1, max_lora_rank=ranks[0]),
        spec("lora-high", gpus=gpu[:2], adapters_dir=str(adapters), max_loras=4, max_lora_rank=ranks[-1]),
        spec("profile-flags", gpus=gpu[:1], max_model_len=4096, extra_args=PROFILE_FLAGS),
    ]


def vllm_argvs(work: Path, baked_version: str) -> list[list[str]]:
    """The guest's vLLM argv (without the binary) for each of vllm_specs, through the unit writer."""
    return [exec_start_argv(cloud_init.render_engine_unit(s))[1:] for s in vllm_specs(work, baked_version)]


def render(baked_version: str) -> str:
    """The text of images/guest/engine-args.json."""
    with tempfile.TemporaryDirectory() as tmp:
        argvs = vllm_argvs(Path(tmp), baked_version)
    helps = {name: list(rt.flags()) for name, rt in RUNTIME_TABLE.items()
             if name != "vllm" and name not in OPENAI_INCAPABLE}
    # One command line or option list a line, so a change reads as a one-line diff.
    return ('{\n "vllm_argvs": [\n  ' + ",\n  ".join(json.dumps(a) for a in argvs) + '\n ],\n "help_options": {\n  '
            + ",\n  ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in helps.items()) + "\n }\n}\n")


def main() -> int:
    from agent.vm.baked import baked_vllm_version

    path = cloud_init.images_dir() / CHECKS_FILE
    path.write_text(render(baked_vllm_version()))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
