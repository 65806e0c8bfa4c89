"""The real `fabricctl` console script driving a real fabricd process (HTTPS with FABRIC_CA)."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
import yaml

from tests.controlplane.conftest import BIN, start_fabricd


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with start_fabricd(tmp_path_factory.mktemp("ctl"), insecure=False) as s:
        yield s


@pytest.fixture(scope="module")
def ctl_env(server, tmp_path_factory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    home = tmp_path_factory.mktemp("ctlhome")
    env.update(FABRIC_URL=server.url, FABRIC_CA=str(server.ca), HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    proc = subprocess.run([str(BIN / "fabricctl"), "ai", "login", "--password-file",
                           str(server.state_dir / "admin-password")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "logged in as admin" in proc.stdout
    config = home / "xdg" / "fabric" / "config"
    assert stat.S_IMODE(os.stat(config).st_mode) == 0o600
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
    out = ctl(ctl_env, "ai", "endpoint", "expose", "qwen3-8b", "--openai-compatible", "--routing", "least_queue",
              "--forwarding", "dsr-ipip").stdout
    assert "qwen3-8b-openai" in out and "forwarding dsr-ipip" in out

    table = ctl(ctl_env, "ai", "deployment", "list").stdout.splitlines()
    assert table[0].split()[:4] == ["NAME", "MODEL", "PROFILE", "REPLICAS"]
    assert table[1].split()[:5] == ["qwen3-8b", "qwen3-8b", "edge-24g", "2", "0"]

    ctl(ctl_env, "ai", "deployment", "scale", "qwen3-8b", "--replicas", "4")
    shown = json.loads(ctl(ctl_env, "ai", "deployment", "show", "qwen3-8b", "--json").stdout)
    assert shown["replicas"] == 4 and shown["status"]["phase"] == "Pending"
    human = ctl(ctl_env, "ai", "deployment", "show", "qwen3-8b").stdout
    assert any(line.split() == ["status.phase", "Pending"] for line in human.splitlines())

    endpoints = json.loads(ctl(ctl_env, "ai", "endpoint", "list", "--json").stdout)
    assert [(e["name"], e["routing"], e["forwarding"]) for e in endpoints] == [
        ("qwen3-8b-openai", "least_queue", "dsr-ipip")]
    routing = ctl(ctl_env, "ai", "explain", "routing", "qwen3-8b-openai").stdout
    assert "forwarding dsr-ipip" in routing
    assert "cold start: placement (choosing a node for a replica)" in routing  # no replica yet (common.cold_phase)
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
        (["ai", "model", "add", "BAD", "--source", "hf://a/b"], "NAME: name 'BAD' is not a DNS label"),
        (["ai", "profile", "add", "big", "--gpu", "9", "--vram", "24", "--cpu", "1", "--memory", "1"],
         "--gpu: must be at most 8, got 9"),
        (["ai", "profile", "add", "big", "--gpu", "0", "--vram", "24", "--cpu", "1", "--memory", "1"],
         "--gpu: must be at least 1, got 0"),
        (["ai", "deploy", "ghost", "--profile", "none"], "model 'ghost' does not exist"),
        (["ai", "endpoint", "expose", "ghost", "--openai-compatible", "--routing", "random"], "--routing: "),
        (["ai", "endpoint", "expose", "ghost", "--spill-to", "BAD_NAME"], "--spill-to: "),
        (["ai", "endpoint", "expose", "ghost", "--fallback", "BAD_NAME"], "--fallback: "),
        (["ai", "endpoint", "expose", "ghost", "--forwarding", "dsr"], "--forwarding: "),
        (["ai", "endpoint", "expose", "ghost", "--forwarding", "dsr-ipip", "--port", "80"], "--forwarding: dsr-ipip"),
        (["ai", "events", "--kind", "bogus"], "--kind: unknown kind 'bogus'"),
    ],
)
def test_server_errors_print_the_message_and_exit_non_zero(ctl_env, args, words):
    proc = ctl(ctl_env, *args, ok=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and words in proc.stderr, proc.stderr


def test_duplicate_is_reported(ctl_env):
    ctl(ctl_env, "ai", "model", "add", "twice", "--source", "/srv/models/x")
    proc = ctl(ctl_env, "ai", "model", "add", "twice", "--source", "/srv/models/x", ok=False)
    assert proc.returncode == 1 and "already exists" in proc.stderr


def test_without_a_token_the_cli_says_how_to_log_in(ctl_env, tmp_path):
    env = {**ctl_env, "XDG_CONFIG_HOME": str(tmp_path)}
    proc = ctl(env, "ai", "model", "list", ok=False)
    assert proc.returncode == 1 and "not logged in" in proc.stderr and "fabricctl ai login" in proc.stderr
    env["FABRIC_TOKEN"] = "garbage"
    proc = ctl(env, "ai", "model", "list", ok=False)
    assert "invalid token" in proc.stderr and "FABRIC_TOKEN" in proc.stderr


def test_unreachable_server_and_untrusted_ca(ctl_env, server, tmp_path):
    env = {**ctl_env, "FABRIC_URL": "https://127.0.0.1:9"}
    proc = ctl(env, "ai", "model", "list", ok=False)
    assert proc.returncode == 3 and "cannot reach fabricd at https://127.0.0.1:9" in proc.stderr
    # No CA anywhere (the logged-in context remembers the CA, so use an empty config).
    env = {k: v for k, v in ctl_env.items() if k != "FABRIC_CA"} | {"XDG_CONFIG_HOME": str(tmp_path)}
    proc = ctl(env, "ai", "model", "list", ok=False)
    assert proc.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in proc.stderr and "FABRIC_CA" in proc.stderr


def test_output_formats(ctl_env):
    ctl(ctl_env, "ai", "model", "add", "fmt", "--source", "hf://org/fmt", "--license", "mit")
    assert yaml.safe_load(ctl(ctl_env, "ai", "models", "show", "fmt", "-o", "yaml").stdout)["license"] == "mit"
    names = ctl(ctl_env, "ai", "models", "ls", "-o", "name").stdout.split()
    assert "model/fmt" in names
    wide = ctl(ctl_env, "ai", "model", "list", "-o", "wide").stdout.splitlines()
    assert "LICENSE" in wide[0].split() and "LICENSE" not in ctl(ctl_env, "ai", "model", "list").stdout
    assert [m["name"] for m in json.loads(ctl(ctl_env, "ai", "mo", "list", "--json").stdout)] == \
        [m["name"] for m in json.loads(ctl(ctl_env, "ai", "model", "list", "-o", "json").stdout)]
    bad = ctl(ctl_env, "ai", "model", "list", "-o", "xml", ok=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_help_version_and_completion(ctl_env, tmp_path):
    assert ctl(ctl_env, "-h").stdout.startswith("Usage: fabricctl")
    deploy_help = ctl(ctl_env, "ai", "deploy", "-h").stdout
    assert "MODEL" in deploy_help.splitlines()[0]
    assert "--wait " in deploy_help and "--timeout " in deploy_help
    assert ctl(ctl_env, "--version").stdout.startswith("fabricctl ")
    for shell in ("bash", "zsh", "fish"):
        script = ctl(ctl_env, "completion", shell).stdout
        assert "_FABRICCTL_COMPLETE" in script
        if shell == "bash":
            (tmp_path / "c.bash").write_text(script)
            check = subprocess.run(["bash", "-n", str(tmp_path / "c.bash")], capture_output=True, text=True)
            assert check.returncode == 0, check.stderr
    # The completion script's own protocol: bash asks with COMP_WORDS/COMP_CWORD.
    env = {**ctl_env, "COMP_WORDS": "fabricctl ai dep", "COMP_CWORD": "2", "_FABRICCTL_COMPLETE": "complete_bash"}
    assert set(ctl(env, ).stdout.split()) >= {"deploy", "deployment"}


def test_login_saves_to_the_context_and_warns_when_fabric_token_overrides(ctl_env, server, tmp_path):
    env = {**ctl_env, "XDG_CONFIG_HOME": str(tmp_path), "FABRIC_TOKEN": "expired-or-not"}
    proc = ctl(env, "ai", "login", "--password-file", str(server.state_dir / "admin-password"))
    assert "warning: FABRIC_TOKEN is set" in proc.stderr and "token saved to context default" in proc.stdout
    saved = yaml.safe_load((tmp_path / "fabric" / "config").read_text())
    assert saved["current-context"] == "default"
    assert saved["contexts"]["default"]["url"] == server.url and saved["contexts"]["default"]["token"]
    # Without the variable the saved context is used: URL, CA and token all come from it.
    env = {k: v for k, v in env.items() if k not in ("FABRIC_TOKEN", "FABRIC_URL", "FABRIC_CA")}
    assert ctl(env, "ai", "model", "list", "-o", "json").returncode == 0
    assert "Traceback" not in ctl(env, "config", "view").stderr
    assert "REDACTED" in ctl(env, "config", "view").stdout


def test_site_add_list_show_delete(ctl_env):
    out = ctl(ctl_env, "ai", "site", "add", "dublin", "--residency", "eu", "--cost-tier", "0.5",
              "--failover", "cork", "--json").stdout
    assert json.loads(out)["failover_sites"] == ["cork"]
    table = ctl(ctl_env, "ai", "site", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "RESIDENCY", "COST_TIER"] and table[1].split()[:3] == ["dublin", "eu", "0.5"]
    assert "site dublin deleted" in ctl(ctl_env, "ai", "site", "delete", "dublin").stdout
    gone = ctl(ctl_env, "ai", "site", "show", "dublin", ok=False)
    assert gone.returncode != 0 and "not found" in gone.stderr
    report = json.loads(ctl(ctl_env, "ai", "finops", "--window", "120", "--json").stdout)
    assert report["window"]["seconds"] == 120 and "alert" not in report
    ctl(ctl_env, "ai", "model", "add", "copyme", "--source", "hf://org/copyme")
    pending = ctl(ctl_env, "ai", "model", "replicate", "copyme", "--site", "dublin", ok=False)
    assert pending.returncode == 1 and "site dublin has no record" in pending.stdout


def test_a_wrong_password_reads_the_same_with_and_without_a_saved_context(ctl_env, server, tmp_path):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not-the-password\n")
    fresh = {**ctl_env, "XDG_CONFIG_HOME": str(tmp_path / "empty")}  # no saved context yet
    answers = []
    for env in (fresh, ctl_env):  # ctl_env's config holds the context its login saved
        proc = ctl(env, "ai", "login", "--password-file", str(wrong), ok=False)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        answers.append(proc.stderr.strip())
    assert answers[0] == answers[1], answers
    assert "wrong username or password" in answers[0] and "not logged in" not in answers[0]
