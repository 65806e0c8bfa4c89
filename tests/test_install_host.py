"""scripts/install-host: the install steps docs/install.md quotes.

In make test: the script is shellcheck-clean, its plan for each role is what docs/install.md
prints (so the page cannot drift from what runs), its options are refused with a reason, and its
idempotency holds (a step acts once, then reports ok; a service restarts only when something it
runs or reads changed), checked by sourcing the script with systemctl and apt stubbed.

In the full profile: scripts/test-install runs the script on a fresh Debian 12 system container
(mmdebstrap + systemd-nspawn) end to end; its JSON says what ran and how long each phase took.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts/install-host"
DOC = REPO / "docs/install.md"
# A plan in the docs: the HTML comment names the arguments, the fenced block after it is the output.
PLAN_BLOCK = re.compile(r"<!-- plan: scripts/install-host (?P<args>[^\n]*?) -->\n```sh\n(?P<body>.*?)```", re.S)


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def bash(snippet: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """SNIPPET after sourcing the script (its main does not run), with systemctl, apt-get and
    dpkg-query replaced by stubs that log their arguments to tmp_path/calls."""
    stubs = f"""
calls={shlex.quote(str(tmp_path / "calls"))}
systemctl() {{ echo "systemctl $*" >> "$calls"; case "$1" in is-active|-q) return 0;; esac; }}
apt-get() {{ echo "apt-get $*" >> "$calls"; }}
source {shlex.quote(str(SCRIPT))}
"""
    return subprocess.run(["bash", "-c", stubs + snippet], capture_output=True, text=True, timeout=60)


def test_the_script_is_shellcheck_clean():
    for script in ("scripts/install-host",):
        result = subprocess.run(["shellcheck", script], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


def test_every_role_s_plan_in_the_docs_is_what_the_script_prints():
    blocks = list(PLAN_BLOCK.finditer(DOC.read_text()))
    roles = {role for b in blocks for role in re.findall(r"--role (\S+)", b["args"])}
    assert roles == {"control-plane", "gateway", "gpu-host"}, "docs/install.md quotes a plan per role"
    for block in blocks:
        result = run_script("--print-plan", *shlex.split(block["args"]))
        assert result.returncode == 0, result.stderr
        assert result.stdout == block["body"], f"docs/install.md's plan for `{block['args']}` is stale"


@pytest.mark.parametrize("args, reason", [
    ([], "give at least one --role"),
    (["--role", "etcd", "--wheel", "x.whl"], "--role etcd: expected control-plane, gateway or gpu-host"),
    (["--role", "gateway"], "--wheel"),
    (["--role", "control-plane", "--wheel", "x.whl"], "needs --address"),
    (["--role", "gateway", "--wheel", "x.whl"], "needs --store"),
    (["--role", "gateway", "--wheel", "x.whl", "--store", "etcd://h:2379"], "needs --etcd-gateway-dir"),
    (["--role", "control-plane", "--role", "gateway", "--wheel", "x.whl", "--address", "10.0.0.1",
      "--etcd-gateway-dir", "/x"], "a control-plane host issues the gateway's etcd login itself"),
    (["--role", "gpu-host", "--wheel", "x.whl", "--node-id", "n1"], "needs --node-id and --control-plane"),
    (["--role", "gateway", "--wheel", "x.whl", "--store", "etcd://h:2379", "--etcd-gateway-dir", "/x",
      "--node-id", "n1"], "belong to --role gpu-host"),
    (["--role", "gpu-host", "--wheel", "x.whl", "--node-id", "n", "--control-plane", "https://h:8443",
      "--address", "10.0.0.1"], "belong to --role control-plane"),
    (["--role", "gpu-host", "--bogus"], "unknown option --bogus"),
])
def test_bad_options_exit_2_naming_what_is_wrong(args, reason):
    result = run_script("--print-plan", *args)
    assert result.returncode == 2 and reason in result.stderr, result.stderr


def test_a_missing_wheel_is_refused_before_anything_runs(tmp_path):
    result = run_script("--role", "gateway", "--wheel", str(tmp_path / "none.whl"), "--store", "etcd://h:2379",
                        "--etcd-gateway-dir", str(tmp_path))
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_a_gateway_s_etcd_login_copy_must_be_whole(tmp_path):
    # Without its password or key the gateway could not log in to etcd: refused before anything runs.
    wheel, login = tmp_path / "fabric-1.0-py3-none-any.whl", tmp_path / "etcd-gateway"
    wheel.write_bytes(b"w")
    login.mkdir()
    for name in ("ca.crt", "etcd-gateway.crt", "etcd-gateway.key"):
        (login / name).write_text("x")
    result = run_script("--role", "gateway", "--wheel", str(wheel), "--store", "etcd://h:2379",
                        "--etcd-gateway-dir", str(login))
    assert result.returncode == 2 and f"--etcd-gateway-dir {login} has no gateway.password" in result.stderr


def test_a_step_acts_once_then_reports_ok_and_dry_run_changes_nothing(tmp_path):
    target = tmp_path / "options"
    snippet = f"""
f={shlex.quote(str(target))}
put() {{ step -r svc "options $f" "same_content $f 'A=1'" "$(write_cmd "$f" 'A=1')"; }}
MODE=dry-run; put; echo "dry changes=$CHANGES"; [ ! -e "$f" ] && echo "dry wrote nothing"
MODE=apply CHANGES=0; put; echo "first changes=$CHANGES restart=${{RESTART[svc]:-}}"
RESTART=() CHANGES=0; put; echo "second changes=$CHANGES restart=${{RESTART[svc]:-}}"
"""
    out = bash(snippet, tmp_path).stdout
    assert "would change: options" in out and "dry changes=1" in out and "dry wrote nothing" in out
    assert "changing: options" in out and "first changes=1 restart=1" in out
    assert f"ok: options {target}" in out and "second changes=0 restart=" in out
    assert target.read_text() == "A=1\n"


def test_services_restart_only_when_what_they_run_changed(tmp_path):
    # A run where the wheel step changed: fabricd restarts. One where nothing changed: no restart,
    # no start (the stub reports every unit enabled and active), and the run says so. (etcd is
    # brought up earlier, by the control-plane steps, before init-auth talks to it.)
    snippet = """
ROLES=(control-plane)
RESTART[fabricd]=1; start_services; echo "--"
RESTART=(); start_services; [ "$CHANGES" = 0 ] && echo "nothing changed"
"""
    result = bash(snippet, tmp_path)
    first, second = (tmp_path / "calls").read_text().split("systemctl -q is-enabled fabricd")[1:]
    assert "systemctl restart fabricd" in first and "etcd" not in first
    assert "restart" not in second and "start " not in second
    assert "nothing changed" in result.stdout


def test_the_wheel_is_installed_again_only_when_its_digest_changes(tmp_path):
    wheel, mark = tmp_path / "fabric-1.0-py3-none-any.whl", tmp_path / "mark"
    wheel.write_bytes(b"one")
    snippet = f"""
WHEEL={shlex.quote(str(wheel))} WHEEL_MARK={shlex.quote(str(mark))} MODE=dry-run ROLES=(gateway)
install_fabric; sha256sum < "$WHEEL" | cut -d' ' -f1 > "$WHEEL_MARK"; install_fabric; echo x > "$WHEEL"; install_fabric
"""
    out = bash(snippet, tmp_path).stdout.splitlines()
    verdicts = [line for line in out if line.endswith(f"Fabric from {wheel.name}")]
    assert verdicts == [f"install-host: would change: Fabric from {wheel.name}",
                        f"install-host: ok: Fabric from {wheel.name}",
                        f"install-host: would change: Fabric from {wheel.name}"]


@pytest.mark.full
@pytest.mark.root
def test_install_host_on_a_fresh_debian_12_container():
    """scripts/test-install: every check of the story passes (docs/install.md executed)."""
    result = subprocess.run([str(REPO / "scripts/test-install")], cwd=REPO, capture_output=True, text=True,
                            timeout=1800)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], f"{report.get('failed')}\n{result.stderr[-6000:]}"
    assert report["seen"]["second_run"][-1] == "install-host: nothing to change"
