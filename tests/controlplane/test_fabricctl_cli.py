"""The real `fabricctl` console script driving a real fabricd process (HTTPS with FABRIC_CA)."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from tests.controlplane.conftest import BIN, start_fabricd


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with start_fabricd(tmp_path_factory.mktemp("ctl"), insecure=False) as s:
        yield s


@pytest.fixture(scope="module")
def ctl_env(server, tmp_path_factory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=server.url, FABRIC_CA=str(server.ca),
               FABRIC_CONFIG_DIR=str(tmp_path_factory.mktemp("ctlcfg")))
    proc = subprocess.run([str(BIN / "fabricctl"), "ai", "login", "--password-file",
                           str(server.state_dir / "admin-password")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "logged in as admin" in proc.stdout
    token_file = os.path.join(env["FABRIC_CONFIG_DIR"], "token")
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    return env


def ctl(env, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "fabricctl"), *args], capture_output=True, text=True, env=env, timeout=60)
    if ok:
        assert proc.returncode == 0, f"fabricctl {' '.join(args)}: {proc.stderr}"
    return proc


def test_the_getting_started_story(ctl_env):
    ctl(ctl_env, "ai", "model", "add", "qwen3-8b", "--source", "hf://Qwen/Qwen3-8B")
    ctl(ctl_env, "ai", "profile", "add", "edge-24g", "--gpu", "1", "--vram", "24", "--cpu", "8", "--memory", "32")
    out = ctl(ctl_env, "ai", "deploy", "qwen3-8b", "--profile", "edge-24g", "--replicas", "2").stdout
    assert "deployment qwen3-8b created" in out
    out = ctl(ctl_env, "ai", "endpoint", "expose", "qwen3-8b", "--openai-compatible", "--routing", "least_queue").stdout
    assert "qwen3-8b-openai" in out

    table = ctl(ctl_env, "ai", "deployment", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "MODEL", "PROFILE", "REPLICAS"]
    assert table[1].split()[:5] == ["qwen3-8b", "qwen3-8b", "edge-24g", "2", "0"]

    ctl(ctl_env, "ai", "deployment", "scale", "qwen3-8b", "--replicas", "4")
    shown = json.loads(ctl(ctl_env, "ai", "deployment", "show", "qwen3-8b", "--json").stdout)
    assert shown["replicas"] == 4 and shown["status"]["phase"] == "Pending"
    human = ctl(ctl_env, "ai", "deployment", "show", "qwen3-8b").stdout
    assert any(line.split() == ["status.phase", "Pending"] for line in human.splitlines())

    endpoints = json.loads(ctl(ctl_env, "ai", "endpoint", "list", "--json").stdout)
    assert [(e["name"], e["routing"]) for e in endpoints] == [("qwen3-8b-openai", "least_queue")]
    assert "edge-24g" in ctl(ctl_env, "ai", "profile", "list").stdout
    assert json.loads(ctl(ctl_env, "ai", "model", "show", "qwen3-8b", "--json").stdout)["source"] == "hf://Qwen/Qwen3-8B"

    events = json.loads(ctl(ctl_env, "ai", "events", "--json").stdout)
    assert [(e["kind"], e["action"]) for e in events] == [
        ("model", "created"), ("profile", "created"), ("deployment", "created"),
        ("endpoint", "created"), ("deployment", "scaled")]
    assert "scaled" in ctl(ctl_env, "ai", "events").stdout

    # Tear down in dependency order; each refusal names what is in the way.
    refused = ctl(ctl_env, "ai", "model", "delete", "qwen3-8b", ok=False)
    assert refused.returncode == 1 and "qwen3-8b" in refused.stderr and "deployment" in refused.stderr
    ctl(ctl_env, "ai", "endpoint", "delete", "qwen3-8b-openai")
    assert "deleted" in ctl(ctl_env, "ai", "deployment", "delete", "qwen3-8b").stdout
    ctl(ctl_env, "ai", "profile", "delete", "edge-24g")
    ctl(ctl_env, "ai", "model", "delete", "qwen3-8b")
    assert ctl(ctl_env, "ai", "model", "list").stdout.strip() == "(none)"


@pytest.mark.parametrize(
    "args, words",
    [
        (["ai", "model", "show", "ghost"], "model 'ghost' not found"),
        (["ai", "model", "add", "BAD", "--source", "hf://a/b"], "body.name"),
        (["ai", "profile", "add", "big", "--gpu", "9", "--vram", "24", "--cpu", "1", "--memory", "1"],
         "body.gpu.count: Input should be less than or equal to 8"),
        (["ai", "deploy", "ghost", "--profile", "none"], "model 'ghost' does not exist"),
        (["ai", "endpoint", "expose", "ghost", "--openai-compatible", "--routing", "random"], "body.routing"),
    ],
)
def test_server_errors_print_the_message_and_exit_non_zero(ctl_env, args, words):
    proc = ctl(ctl_env, *args, ok=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and words in proc.stderr, proc.stderr


def test_duplicate_is_reported(ctl_env):
    ctl(ctl_env, "ai", "model", "add", "twice", "--source", "/models/x")
    proc = ctl(ctl_env, "ai", "model", "add", "twice", "--source", "/models/x", ok=False)
    assert proc.returncode == 1 and "already exists" in proc.stderr


def test_without_a_token_the_cli_reports_401(ctl_env, tmp_path):
    env = {**ctl_env, "FABRIC_CONFIG_DIR": str(tmp_path)}
    proc = ctl(env, "ai", "model", "list", ok=False)
    assert proc.returncode == 1 and "bearer token" in proc.stderr
    env["FABRIC_TOKEN"] = "garbage"
    assert "invalid token" in ctl(env, "ai", "model", "list", ok=False).stderr


def test_unreachable_server_and_untrusted_ca(ctl_env, server):
    env = {**ctl_env, "FABRIC_URL": "https://127.0.0.1:9"}
    proc = ctl(env, "ai", "model", "list", ok=False)
    assert proc.returncode == 1 and "cannot reach fabricd" in proc.stderr
    env = {k: v for k, v in ctl_env.items() if k != "FABRIC_CA"}
    proc = ctl(env, "ai", "model", "list", ok=False)
    assert proc.returncode == 1 and "cannot reach fabricd" in proc.stderr and "CERTIFICATE" in proc.stderr.upper()
