"""The `fabric-engine-sim` console script: starts and serves; refuses impossible knobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from enginesim.process import free_port
from lab.rigs.polling import wait_for

SCRIPT = Path(sys.executable).parent / "fabric-engine-sim"


def test_impossible_knob_stops_start_with_message():
    done = subprocess.run(
        [sys.executable, "-m", "enginesim", "--error-rate", "2"],
        check=False, capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 2
    assert "error_rate" in done.stderr


@pytest.mark.skipif(not SCRIPT.exists(), reason="console script not installed (pip install -e .)")
def test_console_script_serves_with_start_flags():
    port = free_port()
    proc = subprocess.Popen(
        [str(SCRIPT), "--host", "127.0.0.1", "--port", str(port), "--model", "cli-m", "--fail-health",
         "--replica-id", "from-cli"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        def health():
            try:
                return httpx.get(url + "/health", timeout=1)
            except httpx.TransportError:
                return None

        resp = wait_for(health, 20, "fabric-engine-sim to answer", interval=0.05)
        assert resp.status_code == 503 and resp.headers["x-fabric-replica"] == "from-cli"
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "cli-m"
    finally:
        proc.terminate()
        proc.wait(10)
