"""An engine started on the agent's host never inherits the agent's secrets (issue 40): HF_TOKEN
and FABRIC_* stay with the agent; the search path and Python's own variables go along."""

from __future__ import annotations

import json

from agent.vm.base import VmSpec
from agent.vm.dryrun_driver import DryRunDriver
from agent.vm.engine_env import engine_env
from lab.rigs.polling import wait_for


def test_engine_env_keeps_only_what_an_engine_needs():
    env = engine_env({"PATH": "/usr/bin", "HF_TOKEN": "hf_secret", "FABRIC_KEY_HMAC_SECRET": "k",
                      "HUGGING_FACE_HUB_TOKEN": "hf_2", "LANG": "C.UTF-8", "AWS_SECRET_ACCESS_KEY": "a"})
    assert env == {"PATH": "/usr/bin", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}


def test_a_dry_run_engine_process_has_no_hf_token(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_agent_secret_token")
    monkeypatch.setenv("FABRIC_KEY_HMAC_SECRET", "agent-only-secret")
    driver = DryRunDriver(tmp_path / "dry")
    try:
        driver.create(VmSpec(replica_id="env-0", deployment="d", model_name="m", model_source="/models/m"))
        pid = json.loads((driver.state_dir / "env-0.json").read_text())["pid"]
        def read_environ() -> bytes:
            try:
                return open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                return b""

        environ = wait_for(read_environ, 10, f"engine {pid}'s /proc environ", interval=0.05)
        names = {item.split(b"=", 1)[0] for item in environ.split(b"\0") if item}
        assert names and b"PATH" in names
        assert b"HF_TOKEN" not in names and b"FABRIC_KEY_HMAC_SECRET" not in names
    finally:
        for vm in driver.list():
            driver.delete(vm.id)
