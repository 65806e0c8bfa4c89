"""`fabricctl ai deployment history | revise | rollout` against a real fabricd (controllers off)."""

from __future__ import annotations

import json

from tests.controlplane.test_fabricctl_cli import ctl, ctl_env, server  # noqa: F401 (fixtures)


def test_history_revise_and_rollout_commands(ctl_env):  # noqa: F811
    ctl(ctl_env, "ai", "model", "add", "qw", "--source", "hf://Qwen/Qwen3-8B")
    ctl(ctl_env, "ai", "profile", "add", "p1", "--gpu", "1", "--vram", "24", "--cpu", "8", "--memory", "32")
    ctl(ctl_env, "ai", "profile", "add", "p2", "--gpu", "1", "--vram", "48", "--cpu", "8", "--memory", "32")
    ctl(ctl_env, "ai", "deploy", "qw", "--profile", "p1", "--replicas", "2")
    out = ctl(ctl_env, "ai", "deployment", "revise", "qw", "--profile", "p2", "--engine-arg", "--max-num-seqs=8",
              "--reason", "more memory").stdout
    assert "revision 2 written" in out
    table = ctl(ctl_env, "ai", "deployment", "history", "qw").stdout.splitlines()
    assert table[0].split()[:4] == ["REVISION", "MODEL", "PROFILE", "ENGINE_ARGS"]
    assert table[1].split()[:3] == ["1", "qw", "p1"] and table[2].split()[:4] == ["2", "qw", "p2", "--max-num-seqs=8"]

    out = ctl(ctl_env, "ai", "deployment", "rollout", "qw", "--to-revision", "2", "--strategy", "canary",
              "--steps", "10:60,100", "--error-rate-max", "0.02", "--ttft-ms-max", "800").stdout
    assert "rollout 1 of qw started: canary from revision 1 to 2" in out
    rec = json.loads(ctl(ctl_env, "ai", "deployment", "rollout", "status", "qw", "--json").stdout)["rollout"]
    assert [s["percent"] for s in rec["steps"]] == [10, 100] and rec["steps"][0]["secs"] == 60
    assert rec["thresholds"]["error_rate_max"] == 0.02 and rec["thresholds"]["ttft_ms_max"] == 800
    assert "Paused" in ctl(ctl_env, "ai", "deployment", "rollout", "pause", "qw").stdout
    assert "Progressing" in ctl(ctl_env, "ai", "deployment", "rollout", "resume", "qw").stdout
    assert "RollingBack" in ctl(ctl_env, "ai", "deployment", "rollout", "rollback", "qw").stdout

    refused = ctl(ctl_env, "ai", "deployment", "rollout", "qw", "--strategy", "canary", ok=False)
    assert refused.returncode == 1 and "still RollingBack" in refused.stderr
    bad = ctl(ctl_env, "ai", "deployment", "rollout", "qw", "--strategy", "canary", "--steps", "10:x", ok=False)
    assert bad.returncode == 2 and "--steps" in bad.stderr
    bad = ctl(ctl_env, "ai", "deployment", "rollout", "explode", "qw", ok=False)
    assert bad.returncode == 2 and "status, pause" in bad.stderr
