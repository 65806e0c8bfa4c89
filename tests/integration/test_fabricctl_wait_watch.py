"""fabricctl's --wait, -w, replica list/show, logs and drain against a real fabricd (controllers
on) and a real fabric-agent with the dry-run driver (each replica a real fabric-engine-sim):
deploy/scale/expose --wait return when the state is reached, `get deployments -w` and
`events -w` print the changes as the store watch delivers them, `logs` reads the engine's
output through fabricd and the agent, a drain shows the grace left, delete --wait returns when
the record is gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.rigs.polling import wait_for
from tests.integration.orchestration_harness import start_cluster

# full (scripts/test-full; 32 s); make test covers it with --wait and watch in tests/controlplane/test_fabricctl_cli.py and tests/integration/test_cli_mistakes.py; logs and drain in tests/e2e/test_lab_cli_dirs.py and tests/e2e/test_lab_no_drop.py
pytestmark = [pytest.mark.e2e, pytest.mark.full]
BIN = Path(sys.executable).parent


def test_wait_watch_replicas_logs_and_drain(tmp_path):
    with start_cluster(tmp_path, gpus=4, env={"FABRIC_ADDRESS_POOL": "10.96.0.40-10.96.0.41",
                                                      # dry-run engines never report drained: the
                                                      # delete below waits out the graces
                                                      "FABRIC_DRAIN_GRACE_SECS": "5"}) as cluster:
        env = {**cluster.env, "FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token,
               "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
        try:
            run(env, tmp_path)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{cluster.tail()}") from None


def ctl(env, *args, rc=0, timeout=150):
    proc = subprocess.run([str(BIN / "fabricctl"), "ai", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == rc, f"fabricctl ai {' '.join(args)}: {proc.stdout}{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc


def follower(env, tmp_path, name, *args):
    out = open(tmp_path / f"{name}.out", "w")  # noqa: SIM115 - closed by the caller after terminate
    proc = subprocess.Popen([str(BIN / "fabricctl"), "ai", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, out, tmp_path / f"{name}.out"


def run(env, tmp_path):
    ctl(env, "model", "add", "llm", "--source", "hf://Qwen/Qwen3-8B")
    ctl(env, "profile", "add", "g1", "--gpu", "1", "--vram", "24", "--cpu", "1", "--memory", "1")
    deps, deps_out, deps_file = follower(env, tmp_path, "deps", "get", "deployments", "-w")
    evs, evs_out, evs_file = follower(env, tmp_path, "events", "events", "-w", "--kind", "deployment")
    try:
        wait_for(lambda: deps_file.read_text().startswith("(none)") or "NAME" in deps_file.read_text(), 30,
                 "the deployment watch to list")
        out = ctl(env, "deploy", "llm", "--profile", "g1", "--replicas", "2", "--wait", "--timeout", "120")
        assert "2/2 replicas ready" in out.stderr
        shown = json.loads(ctl(env, "deployment", "show", "llm", "-o", "json").stdout)
        assert shown["status"]["ready_replicas"] == 2  # --wait returned only once it was so

        ctl(env, "deployment", "scale", "llm", "--replicas", "3", "--wait", "--timeout", "120")
        reps = json.loads(ctl(env, "replica", "list", "-o", "json").stdout)
        assert len(reps) == 3 and all(r["ready"] for r in reps)
        out = ctl(env, "endpoint", "expose", "llm", "--wait", "--timeout", "60")
        assert "VIP 10.96.0.4" in out.stderr

        # The watchers saw the changes as they happened.
        wait_for(lambda: "scaled" in evs_file.read_text(), 30, "events -w to print the scale")
        wait_for(lambda: any(line.split()[:5] == ["llm", "llm", "g1", "3", "3"]
                             for line in deps_file.read_text().splitlines()), 30, "get -w to show 3/3")
    finally:
        for p, f in ((deps, deps_out), (evs, evs_out)):
            p.terminate()
            p.wait(10)
            f.close()
    assert "created" in evs_file.read_text()

    # Logs: the engine's output, from the agent through fabricd; -f follows.
    rid = reps[0]["replica_id"]
    assert f"replica {rid}" in ctl(env, "logs", rid).stdout
    assert ctl(env, "replica", "show", rid, "-o", "name").stdout.strip() == f"replica/{rid}"
    assert "replica 'ghost-0' not found" in ctl(env, "logs", "ghost-0", rc=1).stderr
    logs, logs_out, logs_file = follower(env, tmp_path, "logs", "logs", rid, "-f")
    try:
        wait_for(lambda: f"replica {rid}" in logs_file.read_text(), 30, "logs -f to print")
        assert logs.poll() is None  # still following
    finally:
        logs.terminate()
        logs.wait(10)
        logs_out.close()

    # A drain shows the grace left, in the command's answer and in replica list.
    out = ctl(env, "deployment", "drain", "llm", "--replica", rid, "--grace-secs", "15").stdout
    assert f"{rid}: weight 0, deleted in" in out
    row = next(r for r in json.loads(ctl(env, "replica", "list", "-o", "json").stdout) if r["replica_id"] == rid)
    assert row["draining"] and 0 < row["drain_left_s"] <= 15
    assert "s" in ctl(env, "replica", "list").stdout.split(rid, 1)[1].splitlines()[0]

    ctl(env, "endpoint", "delete", "llm-openai", "--wait", "--timeout", "60")
    ctl(env, "deployment", "delete", "llm", "--wait", "--timeout", "120")
    assert ctl(env, "deployment", "show", "llm", rc=1).stderr.startswith("error: deployment 'llm' not found")
    assert json.loads(ctl(env, "replica", "list", "-o", "json").stdout) == []
    ctl(env, "deployment", "delete", "nope", "--wait", rc=1)
