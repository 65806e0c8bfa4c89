"""GET /ready reflects whether the store (and so the limits) can be reached (issue 37): a real
gateway on a real etcd is ready, and not ready (503) once etcd is stopped, while /health, the
liveness answer, stays 200."""

from __future__ import annotations

import httpx
import pytest

from lab.rigs.etcd_server import ETCD_BINARY, EtcdServer, etcd_available
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess


def test_ready_follows_the_store(tmp_path):
    if not etcd_available():
        pytest.skip(f"etcd binary not found at {ETCD_BINARY}")
    etcd = EtcdServer().start()
    gw = None
    try:
        gw = GatewayProcess.start(tmp_path, etcd.url, etcd.env("gateway"))
        r = httpx.get(gw.url + "/ready", timeout=10)
        assert r.status_code == 200 and r.json() == {"status": "ready", "store": "reachable"}
        etcd.stop()
        r = wait_for(lambda: r if (r := httpx.get(gw.url + "/readyz", timeout=10)).status_code != 200 else None, 30,
                     "/readyz to say the store is gone", interval=0.2)
        assert r.status_code == 503 and r.json()["status"] == "not_ready" and r.json()["store"] == "unreachable"
        assert "127.0.0.1" not in r.text
        assert httpx.get(gw.url + "/health", timeout=10).status_code == 200
    finally:
        if gw is not None:
            gw.stop()
        etcd.stop()
