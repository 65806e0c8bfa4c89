"""/metrics is public unless FABRIC_METRICS_TOKEN is set; then fabricd and the gateway answer it
only for that bearer token (issue 40)."""

from __future__ import annotations

import asyncio

import httpx

from common.store.connect import open_store
from tests.controlplane.conftest import start_fabricd

TOKEN = "metrics-scrape-token-0123456789"


def test_fabricd_metrics_need_the_token_when_set(tmp_path):
    with start_fabricd(tmp_path, env={"FABRIC_METRICS_TOKEN": TOKEN}) as server:
        with httpx.Client(base_url=server.url, timeout=10) as c:
            bare = c.get("/metrics")
            assert bare.status_code == 401 and bare.json()["error"]["code"] == "no_token"
            assert TOKEN not in bare.text
            assert c.get("/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
            ok = c.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
            assert ok.status_code == 200 and "# HELP" in ok.text
            assert c.get("/healthz").status_code == 200  # health stays public


def test_gateway_metrics_need_the_token_when_set(tmp_path):
    from gateway.assemble import create_app
    from gateway.settings import load

    store = open_store(f"sqlite://{tmp_path}/m.db")
    app = create_app(load({"FABRIC_METRICS_TOKEN": TOKEN}), store, b"secret", "gw-metrics")
    open_app = create_app(load({}), store, b"secret", "gw-open")

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c, \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=open_app), base_url="http://gw") as o:
            assert (await c.get("/metrics")).status_code == 401
            assert (await c.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})).status_code == 200
            assert (await o.get("/metrics")).status_code == 200  # unset: public, as before

    try:
        asyncio.run(scenario())
    finally:
        app.state.audit.close()
        open_app.state.audit.close()
        store.close()
