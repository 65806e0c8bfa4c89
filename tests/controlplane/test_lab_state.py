"""Where the lab keeps its state, and the operator's env file (no root, no lab needed)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from lab.cluster import DEFAULT_STATE, env_file_text, lab_state_dir, write_private
from tests.controlplane.conftest import BIN


def test_the_state_dir_is_absolute_whatever_the_directory(tmp_path, monkeypatch):
    assert lab_state_dir({}) == DEFAULT_STATE == Path("/var/lib/fabric/lab")
    monkeypatch.chdir(tmp_path)
    assert lab_state_dir({"FABRIC_LAB_STATE": "rel/lab"}) == tmp_path / "rel" / "lab"


def test_env_file_is_private_and_puts_fabricctl_on_path(tmp_path):
    env_file = tmp_path / "env"
    write_private(env_file, env_file_text({"FABRIC_URL": "https://127.0.0.1:8443", "FABRIC_TOKEN": "t0k'en",
                                           "FABRIC_CA": str(tmp_path / "ca.crt")}, str(BIN)))
    assert stat.S_IMODE(os.stat(env_file).st_mode) == 0o600
    # A shell with a PATH that lacks the venv finds fabricctl after sourcing, with the values intact.
    out = subprocess.run(["bash", "-c", f"source {env_file}; command -v fabricctl; printf %s \"$FABRIC_TOKEN\""],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                         check=True).stdout.splitlines()
    assert out == [str(BIN / "fabricctl"), "t0k'en"]


def test_lab_commands_without_a_lab_say_so_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env["FABRIC_LAB_STATE"] = str(tmp_path / "nolab")
    demo = subprocess.run([str(BIN / "fabric-lab"), "demo"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert demo.returncode == 1 and "Traceback" not in demo.stderr
    assert demo.stderr.startswith("error: the lab is not up") and str(tmp_path / "nolab") in demo.stderr
    # Status of this (absent) lab names no process; another lab on the machine may hold the
    # shared namespace names, so only the processes are this lab's own.
    status = subprocess.run([str(BIN / "fabric-lab"), "status"], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert status.returncode == 0 and "Traceback" not in status.stderr and "process " not in status.stdout
    load = subprocess.run([str(Path(__file__).parents[2] / "scripts" / "lab-load"), "--queue", "1",
                           "--replica", "0"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert load.returncode != 0 and "Traceback" not in load.stderr and "the lab is not up" in load.stderr


def test_console_hint_names_the_url_and_login_files_fabricd_init_makes(tmp_path):
    from lab.cluster import LabConfig

    cfg = LabConfig(state_dir=tmp_path, api_port=18443)
    subprocess.run([str(BIN / "fabricd"), "init", "--state-dir", str(cfg.fabricd_dir)], check=True, capture_output=True)
    hint = cfg.console_hint()
    assert "https://127.0.0.1:18443/app/ai" in hint
    for name in ("admin-password", "viewer-password"):
        path = cfg.fabricd_dir / name
        assert str(path) in hint and path.is_file()
        assert path.read_text().strip() not in hint  # the file's path, never the password


def test_up_refuses_a_lab_that_is_up_and_keeps_its_state(tmp_path):
    """A live lab process (from its pid file) or a listener on fabricd's port means up; `up`
    then raises before it touches anything. A directory with only stale pid files is not up."""
    import socket
    import sys

    import pytest

    from lab.cluster import LabConfig, LabIsUp, up, up_signs
    from lab.rigs.servers import free_port

    state = tmp_path / "lab"
    (state / "pids").mkdir(parents=True)
    (state / "fabricd").mkdir()
    (state / "fabricd" / "store.db").write_text("the lab's records")
    cfg = LabConfig(state_dir=state, api_port=free_port())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (state / "pids" / "fabricd.pid").write_text(str(dead.pid))
    assert up_signs(cfg) == []  # a crashed run's leftovers: `up` may clean them

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (state / "pids" / "fabricd.pid").write_text(str(live.pid))
        assert up_signs(cfg) == [f"fabricd pid {live.pid}"]
        with pytest.raises(LabIsUp) as err:
            up(cfg, echo=lambda *_: None)
        assert str(err.value).startswith("the lab is up; 'fabric-lab down' first, or --force")
        assert (state / "fabricd" / "store.db").read_text() == "the lab's records"
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()

    with socket.socket() as sock:  # a lab from another state directory holds the port
        sock.bind(("127.0.0.1", cfg.api_port))
        sock.listen()
        assert up_signs(cfg) == [f"something listens on fabricd's port {cfg.api_port}"]


def test_the_lab_node_reports_a_site_and_the_server_sized_cpu_and_memory(tmp_path):
    from lab.cluster import LabConfig, agent_command

    cmd = agent_command(LabConfig(state_dir=tmp_path))
    assert cmd[cmd.index("--site") + 1] == "default"
    assert (cmd[cmd.index("--cpus") + 1], cmd[cmd.index("--memory-gib") + 1]) == ("128", "1024")


def test_make_run_stops_waiting_when_its_labs_processes_are_gone(tmp_path, monkeypatch, capsys):
    """`make run` no longer prints "Lab running" over a lab taken down elsewhere: its wait ends,
    saying so, once no process of the lab's state directory is alive."""
    from lab.cluster import LabConfig
    from lab.run_main import _wait

    monkeypatch.delenv("FABRIC_LAB_EXIT_AFTER_DEMO", raising=False)
    assert _wait(LabConfig(state_dir=tmp_path / "gone"), {"now": False}) is False
    assert "the lab's processes have stopped" in capsys.readouterr().err
    assert _wait(LabConfig(state_dir=tmp_path / "gone"), {"now": True}) is True  # Ctrl-C / TERM


def test_the_demo_reads_the_engine_the_running_lab_recorded(tmp_path):
    """`fabric-lab demo` waits as long as the running lab's engine needs (real vLLM: minutes), whatever
    the config it was started with says; no lab.json: the config's engine."""
    from lab.cluster import LabConfig
    from lab.demo import lab_engine_of

    assert lab_engine_of(LabConfig(tmp_path)) == "sim"
    (tmp_path / "lab.json").write_text('{"engine": "vllm", "FABRIC_URL": "https://127.0.0.1:8443"}')
    assert lab_engine_of(LabConfig(tmp_path)) == "vllm"
