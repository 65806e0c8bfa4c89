"""fabricd, fabric-agent and fabric-gateway answer /healthz in one shape (common.health), as the
real processes; fabricd's log at INFO carries no probe lines while /healthz is polled."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from lab.rigs.polling import clean_env, wait_for
from lab.rigs.servers import free_port
from tests.controlplane.conftest import start_fabricd
from tests.gateway.gateway_harness import GatewayProcess

BIN = Path(sys.executable).parent
SHAPE = {"status", "component", "version", "checks"}


def test_one_healthz_shape_for_the_three_processes(tmp_path):
    with start_fabricd(tmp_path) as server:
        body = httpx.get(f"{server.url}/healthz", timeout=5).json()
        assert set(body) == SHAPE and (body["component"], body["status"]) == ("fabricd", "ok")
        assert body["checks"]["store"] == "ok"

        gw = GatewayProcess.start(server.state_dir, f"sqlite://{server.state_dir}/fabric.db")
        try:
            body = httpx.get(f"{gw.url}/healthz", timeout=5).json()
            assert set(body) == SHAPE and body["component"] == "fabric-gateway"
        finally:
            gw.stop()

    port = free_port()
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen([str(BIN / "fabric-agent"), "serve", "--node-id", "n1", "--insecure", "--listen",
                                  f"127.0.0.1:{port}", "--vm-driver", "dry-run", "--no-dataplane", "--fake-gpus", "1",
                                  "--state-dir", str(tmp_path / "agent"), "--log-level", "info"],
                                 stdout=out, stderr=subprocess.STDOUT, env=clean_env())
    try:
        def answered():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
            except httpx.TransportError:
                return None
        body = wait_for(answered, 30, "the agent's /healthz")
        assert set(body) == SHAPE and body["component"] == "fabric-agent"
        assert body["checks"]["dataplane"].startswith("off") and body["status"] == "ok"
        for _ in range(5):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        httpx.get(f"http://127.0.0.1:{port}/v1/vms", timeout=2)
        time.sleep(0.5)
        text = log.read_text()
        assert "GET /v1/vms" in text  # the access log is on, at INFO ...
        assert "/healthz" not in text  # ... and the probes are not in it
    finally:
        agent.terminate()
        agent.wait(10)
