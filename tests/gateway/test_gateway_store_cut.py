"""A gateway cut off from its store stops serving (docs/sites.md "Fail-closed sites"): a real
gateway on a real etcd answers a key's call, and once etcd is stopped the same call is refused
as soon as the gateway's cached records expire (FABRIC_GATEWAY_CACHE_SECS), never served from a
stale copy; its liveness answer stays 200."""

from __future__ import annotations

import httpx
import pytest

from lab.rigs.etcd_server import ETCD_BINARY, EtcdServer, etcd_available
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine


def _call(gw: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(f"{gw.openai_base('edge')}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                      timeout=30)


def test_a_gateway_without_its_store_refuses_calls(tmp_path):
    if not etcd_available():
        pytest.skip(f"etcd binary not found at {ETCD_BINARY}")
    etcd = EtcdServer(secure=False).start()  # the store's security is beside the point here
    gw = None
    try:
        store = etcd.open()
        with sim_engine() as eng:
            publish_endpoint(store, "edge", [eng])
            _, key = make_key(store, "edge")
            store.close()
            gw = GatewayProcess.start(tmp_path, etcd.url, {**etcd.env("gateway"), "FABRIC_GATEWAY_CACHE_SECS": "0.5"})
            assert _call(gw, key).status_code == 200
            etcd.stop()
            r = wait_for(lambda: r if (r := _call(gw, key)).status_code != 200 else None, 30,
                         "a refusal once the store is gone", interval=0.1)
            assert r.status_code == 503, r.text
            assert httpx.get(gw.url + "/health", timeout=10).status_code == 200
    finally:
        if gw is not None:
            gw.stop()
        etcd.stop()
