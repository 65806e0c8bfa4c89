"""Every vLLM command line Fabric's guest unit can write, parsed by the pinned vLLM's own parser.

The argvs come from the unit writer (agent/vm/engine_checks.py through cloud_init.render_engine_unit);
images/guest/check-vllm-args.py parses them with the parser `vllm serve` builds, in the lab's engine
environment (.venv-engine), which is the version the guest bakes (test_engine_version.py). The bake
runs the same script against the vLLM it installed (images/guest/install-guest.sh). One run of the
checker (importing vLLM takes ~15 s) carries the guest's command lines and the misspelt ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agent.settings import REPO_ENGINE_PYTHON
from agent.vm.baked import baked_vllm_version
from agent.vm.engine_checks import PROFILE_FLAGS, render, vllm_argvs
from agent.vm.lab_engine import engine_installed

REPO = Path(__file__).resolve().parents[2]
CHECKS = REPO / "images/guest/engine-args.json"
CHECKER = REPO / "images/guest/check-vllm-args.py"
# Appended to a good command line: each must be refused, naming the flag.
BAD = {
    "--tensor-paralel-size": ["--tensor-paralel-size", "2"],  # misspelt
    "--kv-events-configuration": ["--kv-events-configuration", "{}"],  # a name vLLM never had
    "--max-model-len": ["--max-model-len", "many"],  # a value its parser refuses
}


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    missing = engine_installed()
    assert missing is None, f"the real engine is part of setup (scripts/setup-engine.sh): {missing}"
    tmp = tmp_path_factory.mktemp("engine-args")
    argvs = vllm_argvs(tmp / "work", baked_vllm_version())
    path = tmp / "engine-args.json"
    path.write_text(json.dumps({"vllm_argvs": argvs + [argvs[0] + bad for bad in BAD.values()]}))
    done = subprocess.run([str(REPO_ENGINE_PYTHON), str(CHECKER), str(path)], capture_output=True, text=True,
                          timeout=300, check=False)
    return argvs, done


def test_the_bakes_checks_are_what_the_unit_writer_renders_now():
    assert CHECKS.read_text() == render(baked_vllm_version()), (
        "images/guest/engine-args.json is stale: run `python -m agent.vm.engine_checks`")


def test_every_guest_command_line_parses_with_the_pinned_vllm(parsed):
    argvs, done = parsed
    flags = {a for argv in argvs for a in argv if a.startswith("--")}
    # What Fabric writes: the base command, KV events, the stop, both parallel sizes, a context
    # length, LoRA and the flags profiles pass.
    assert {"--kv-events-config", "--shutdown-timeout", "--tensor-parallel-size", "--pipeline-parallel-size",
            "--max-model-len", "--enable-lora", "--max-loras", "--max-lora-rank"} <= flags
    assert {f for f in PROFILE_FLAGS if f.startswith("--")} <= flags
    refused = [line for line in done.stderr.splitlines() if line.startswith("check-vllm-args:")]
    assert len(refused) == len(BAD), done.stderr[-3000:]  # only the misspelt ones
    assert f"vLLM {baked_vllm_version()} parsed {len(argvs)} of {len(argvs) + len(BAD)} command lines" in done.stdout


@pytest.mark.parametrize("flag", sorted(BAD))
def test_a_flag_vllm_does_not_know_fails_naming_it(parsed, flag):
    _, done = parsed
    assert done.returncode == 1
    refused = [line for line in done.stderr.splitlines() if line.startswith("check-vllm-args:")]
    assert any(flag in line.split(" (in: ", 1)[0] for line in refused), refused  # the reason names it
