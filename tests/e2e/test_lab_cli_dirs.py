"""The lab through its real console scripts from different directories: `fabric-lab up` in one,
`status`, `demo` (twice: it is re-runnable) and `down` in another; down stops what up started and
names it, and nothing is left. A second `up` on the running lab refuses and keeps its data, and
`make run`'s entry point on it attaches and shows the demo's objects instead of wiping them;
then docs/examples/ applies to it as shipped, and a real Prometheus scrapes it with
docs/dashboards/prometheus.yml and evaluates every dashboard panel's query. Uses the lab's fixed names and ports, so it holds the lab lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cluster import LabConfig, status
from lab.processes import running
from lab.rigs.lab_lock import lab_lock, lab_unavailable
from tests.e2e.prom_scrape import scrape_lab_and_query

BIN = Path(sys.executable).parent


pytestmark = [pytest.mark.e2e, pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]


def lab(cwd: Path, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "fabric-lab"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def fabricctl(env_file: Path, cwd: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {env_file}; fabricctl ai {command}"], cwd=cwd,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)


def apply_examples(env_file: Path, cwd: Path) -> None:
    """docs/examples/ as shipped applies to the lab after its demo: the demo's objects are the
    documents' (unchanged), the tenant's are made and its model comes from the lab's mirror."""
    examples = Path(__file__).parents[2] / "docs" / "examples"
    applied = fabricctl(env_file, cwd, f"apply -f {examples}")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    lines = set(applied.stdout.splitlines())
    assert {"modelartifact/demo-llm unchanged", "inferenceprofile/lab-h100 unchanged",
            "inferencedeployment/demo-llm unchanged", "inferenceendpoint/demo-llm-openai unchanged",
            "tenantquota/acme created", "modelartifact/acme-chat created",
            "inferencedeployment/acme-chat created"} <= lines, applied.stdout
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        shown = json.loads(fabricctl(env_file, cwd, "deployment show acme-chat -o json").stdout or "{}")
        if (shown.get("status") or {}).get("ready_replicas", 0) >= 1:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"acme-chat has no ready replica: {shown.get('status')}\n"
                             + fabricctl(env_file, cwd, "model status acme-chat").stdout)
    again = fabricctl(env_file, cwd, f"apply -f {examples}")
    assert again.returncode == 0 and all(line.endswith(" unchanged") for line in again.stdout.splitlines()), \
        again.stdout + again.stderr


def test_lab_up_in_one_directory_demo_twice_and_down_in_another(tmp_path):
    state = tmp_path / "lab-state"
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir()
    there.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env["FABRIC_LAB_STATE"] = str(state)
    env["FABRIC_LAB_ENGINE"] = "sim"  # `lab up` would pick the real vLLM when installed: this test is the CLI's
    cfg = LabConfig(state_dir=state)
    started = 0
    with lab_lock():
        try:
            up = lab(here, env, "up")
            assert up.returncode == 0, up.stdout + up.stderr
            shown = lab(there, env, "status").stdout
            started = shown.count("process ")  # fabricd, the agent, the gateway (and the lab's helpers)
            assert started >= 3 and "netns fabric-lab-node" in shown
            for _ in range(2):
                demo = lab(there, env, "demo")
                assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr
            assert "already there from an earlier demo: reused" in demo.stdout
            assert "(the LoRA adapter: the replica loads it" in demo.stdout  # and it answered 200
            env_file = state / "env"
            assert oct(env_file.stat().st_mode & 0o777) == "0o600"
            # The hint works: a shell whose PATH lacks the venv sources env and runs fabricctl.
            ctl = subprocess.run(["bash", "-c", f"source {env_file}; fabricctl ai endpoint list -o name"],
                                 cwd=there, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
            assert ctl.stdout.split() == ["endpoint/demo-llm-openai"], ctl.stderr
            # A lab replica's engine output, served by the agent through fabricd.
            script = (f"source {env_file}; "
                      "fabricctl ai logs $(fabricctl ai replica list -o name | head -1 | cut -d/ -f2)")
            logs = subprocess.run(["bash", "-c", script],
                                  cwd=there, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
            assert "fabric-engine-sim: serving demo-llm" in logs.stdout, logs.stderr
            pids_before = running(state)
            # `lab up` again refuses (no silent down) and the demo's objects are still there.
            again = lab(here, env, "up")
            assert again.returncode == 1, again.stdout + again.stderr
            assert "the lab is up; 'fabric-lab down' first, or --force" in again.stderr
            assert running(state) == pids_before
            # `make run` (lab.run_main) on the up lab attaches and shows the demo's state.
            attach = subprocess.run([sys.executable, "-m", "lab.run_main"], cwd=Path.cwd(),
                                    env={**env, "FABRIC_LAB_EXIT_AFTER_DEMO": "1"}, capture_output=True, text=True,
                                    timeout=120)
            assert attach.returncode == 0, attach.stdout + attach.stderr
            assert "The lab is already up" in attach.stdout and "tearing the lab down" not in attach.stdout
            assert "demo-llm-openai" in attach.stdout and "== The lab is yours" in attach.stdout
            assert running(state) == pids_before
            ctl = subprocess.run(["bash", "-c", f"source {env_file}; fabricctl ai endpoint list -o name"],
                                 cwd=there, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
            assert ctl.stdout.split() == ["endpoint/demo-llm-openai"], ctl.stderr
            apply_examples(env_file, there)
            # docs/dashboards/prometheus.yml with a real Prometheus: every panel's query evaluates.
            answered = scrape_lab_and_query(cfg, tmp_path)
            assert len(answered) >= 25
            assert answered["sum by (controller, outcome) (rate(fabric_controller_ticks_total[1m]))"] > 0
            # scripts/lab-load takes a replica by name and watches weights by replica name.
            names = fabricctl(env_file, there, "replica list -o name").stdout.split()
            first = [n.split("/", 1)[1] for n in names if n.startswith("replica/demo-llm-")][0]
            loaded = subprocess.run([str(Path(__file__).parents[2] / "scripts" / "lab-load"), "--state-dir", str(state),
                                     "--replica", first, "--queue", "0"], capture_output=True, text=True, timeout=60)
            assert loaded.returncode == 0, loaded.stderr
            assert f"replica {first} (" in loaded.stdout and f"{first}=" in loaded.stdout.splitlines()[-1]
        finally:
            down = lab(there, env, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert down.stdout.count("removed process ") >= started and "removed netns fabric-lab-node" in down.stdout
        assert "nothing left behind" in down.stdout
        assert status(cfg) == [] and running(state) == []
        assert "lab is down" in lab(here, env, "status").stdout
