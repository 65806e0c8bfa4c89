"""The host's systemd units (images/host/systemd) read the way systemd and our CLIs read them.

- `systemd-analyze verify` loads each unit (every directive known, ExecStart executable) on a copy
  whose install prefix /opt/fabric/venv is this checkout's venv (the only change);
- `systemd-analyze security --offline=true` scores each unit's sandbox: fabricd and the gateway
  stay "OK" (<= 2.0); the agent, which BPF, VFIO and libvirt keep out of a mount namespace,
  stays below 6.0, and none of the options that would make one sneaks in;
- ExecStart, with the unit's Environment= and the example /etc/default file expanded as
  systemd does ($VAR alone splits into words), parses with the real command's options;
- `systemd-sysusers --root` creates the `fabric` user the two unprivileged units run as.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import typer

REPO = Path(__file__).resolve().parents[1]
HOST = REPO / "images/host"
PREFIX = "/opt/fabric/venv"
UNITS = ("fabricd", "fabric-gateway", "fabric-agent")
EXTRA = ("fabric-agent-renew.service", "fabric-agent-renew.timer", "fabric-backup.service", "fabric-backup.timer")
MOUNT_NAMESPACE_OPTIONS = ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "ProtectKernelTunables",
                           "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ProtectClock",
                           "ProtectHostname", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
                           "TemporaryFileSystem", "PrivateMounts", "BindPaths", "ProtectProc", "ProcSubset")

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze (Debian package systemd) is not installed")


def unit_entries(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value, in order (systemd keeps repeated keys)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def environment_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines with shell-like quoting, as systemd reads EnvironmentFile=."""
    env = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = " ".join(shlex.split(value))
    return env


def unit_environment(unit: dict, name: str) -> dict[str, str]:
    """Environment= (several assignments a line) then the example /etc/default file, as systemd."""
    env = dict(w.split("=", 1) for line in unit["Service"].get("Environment", []) for w in shlex.split(line))
    env.update(environment_file((HOST / f"default/{name}").read_text()))
    return env


def exec_argv(unit: dict, env: dict[str, str], key: str = "ExecStart") -> list[str]:
    """A command's words with $VAR (alone: split into words) and ${VAR} (in a word) expanded."""
    words = []
    for word in shlex.split(unit["Service"][key][0]):
        alone = re.fullmatch(r"\$(\w+)", word)
        if alone:
            words += env.get(alone.group(1), "").split()
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def command_for(program: str):
    if program == "fabricd":
        from controlplane.cli_fabricd import app
    elif program == "fabric-gateway":
        from gateway.cli import app
    else:
        from agent import cli

        cli._register()
        app = cli.app
    return typer.main.get_command(app)


def parse_like_the_cli(argv: list[str]):
    """Parse argv with the program's own (typer's) click command, without running it."""
    group = command_for(Path(argv[0]).name)
    sub = group.get_command(group.make_context(argv[0], [argv[1]], resilient_parsing=True), argv[1])
    assert sub is not None, f"{argv[0]} has no command {argv[1]}"
    return sub.make_context(argv[1], argv[2:])


def test_systemd_analyze_verify_accepts_every_unit(tmp_path):
    venv = REPO / ".venv"
    files = [f"{n}.service" for n in UNITS] + list(EXTRA)
    for name in files:
        text = (HOST / f"systemd/{name}").read_text()
        assert text.count(PREFIX) >= 1 or name.endswith(".timer")
        (tmp_path / name).write_text(text.replace(PREFIX, str(venv)))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *[str(tmp_path / n) for n in files]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def exposure(unit: Path) -> float:
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
                          capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert match, done.stdout[-500:] + done.stderr
    return float(match.group(1))


def test_sandboxes_are_as_tight_as_each_process_allows():
    assert exposure(HOST / "systemd/fabricd.service") <= 2.0
    assert exposure(HOST / "systemd/fabric-gateway.service") <= 2.0
    assert exposure(HOST / "systemd/fabric-agent.service") < 6.0
    fabricd = unit_entries((HOST / "systemd/fabricd.service").read_text())["Service"]
    gateway = unit_entries((HOST / "systemd/fabric-gateway.service").read_text())["Service"]
    agent = unit_entries((HOST / "systemd/fabric-agent.service").read_text())["Service"]
    assert fabricd["CapabilityBoundingSet"] == [""] and fabricd["User"] == ["fabric"]
    assert gateway["CapabilityBoundingSet"] == ["CAP_NET_BIND_SERVICE"] and gateway["User"] == ["fabric"]
    assert "PrivateUsers" not in gateway  # a capability in a user namespace binds no host port
    # The agent's bind mounts, BPF pins and sysfs writes must reach the host's mount namespace.
    assert not [k for k in MOUNT_NAMESPACE_OPTIONS if k in agent], agent
    assert agent["NoNewPrivileges"] == ["yes"] and "CAP_SYS_MODULE" not in agent["CapabilityBoundingSet"][0]
    assert "MemoryDenyWriteExecute" not in agent  # numba JIT-compiles the Maglev table builder
    for unit in (fabricd, gateway):
        assert unit["MemoryDenyWriteExecute"] == ["yes"] and unit["NoNewPrivileges"] == ["yes"]


@pytest.mark.parametrize("name", UNITS)
def test_exec_start_parses_with_the_programs_own_options(name):
    unit = unit_entries((HOST / f"systemd/{name}.service").read_text())
    env = unit_environment(unit, name)
    assert unit["Service"]["EnvironmentFile"] == [f"-/etc/default/{name}"]
    argv = exec_argv(unit, env)
    assert argv[0] == f"{PREFIX}/bin/{name}" and argv[1] == "serve"
    ctx = parse_like_the_cli(argv)
    state_dir = str(ctx.params["state_dir"])
    assert unit["Service"]["StateDirectory"] == [Path(state_dir).name] and state_dir.startswith("/var/lib/")
    with pytest.raises(Exception, match="No such option: --no-such-option"):
        parse_like_the_cli([*argv, "--no-such-option"])  # the parse is the real one


def test_sysusers_creates_the_service_user(tmp_path):
    (tmp_path / "etc").mkdir()
    done = subprocess.run(["systemd-sysusers", f"--root={tmp_path}", str(HOST / "sysusers.d/fabric.conf")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    users = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc/passwd").read_text().splitlines()}
    assert "fabric" in users and users["fabric"][6] == "/usr/sbin/nologin"


def test_the_renewal_timer_runs_the_agents_own_renew_command():
    unit = unit_entries((HOST / "systemd/fabric-agent-renew.service").read_text())
    env = unit_environment(unit, "fabric-agent")
    check = exec_argv(unit, env, "ExecCondition")
    renew = exec_argv(unit, env, "ExecStart")
    assert check[1:3] == ["renew-cert", "--check"] and renew[1] == "renew-cert"
    for argv in (check, renew):
        ctx = parse_like_the_cli(argv)
        assert ctx.params["node_id"] == "gpu-7" and len(ctx.params["control_plane"][0].split(",")) == 3
        assert str(ctx.params["pki_dir"]) == "/var/lib/fabric-agent/pki"
    assert unit["Service"]["ExecStartPost"] == ["/usr/bin/systemctl try-restart fabric-agent.service"]
    timer = unit_entries((HOST / "systemd/fabric-agent-renew.timer").read_text())
    assert timer["Timer"]["OnUnitActiveSec"] == ["1d"] and timer["Install"]["WantedBy"] == ["timers.target"]


def test_the_backup_timer_runs_fabricds_own_backup_command_daily():
    unit = unit_entries((HOST / "systemd/fabric-backup.service").read_text())
    env = unit_environment(unit, "fabricd")
    env.update(environment_file((HOST / "default/fabric-backup").read_text()))
    argv = exec_argv(unit, env)
    assert argv[1:3] == ["backup", "create"]
    group = command_for("fabricd").get_command(None, "backup")
    ctx = group.get_command(None, "create").make_context("create", argv[3:])
    assert str(ctx.params["state_dir"]) == "/var/lib/fabricd" and str(ctx.params["key_file"]) == "/etc/fabric/backup.key"
    assert ctx.params["store"].startswith("etcd://") and ctx.params["keep"] == 14
    assert unit["Service"]["User"] == ["fabric"] and unit["Service"]["Type"] == ["oneshot"]
    assert "EnvironmentFile" in unit["Service"] and "-/etc/default/fabricd" in unit["Service"]["EnvironmentFile"]
    timer = unit_entries((HOST / "systemd/fabric-backup.timer").read_text())
    assert timer["Timer"]["OnCalendar"] == ["daily"] and timer["Timer"]["Persistent"] == ["true"]
    assert timer["Install"]["WantedBy"] == ["timers.target"]
