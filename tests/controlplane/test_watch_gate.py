"""Watches (GET /api/ai/watch/...) wait on threads of their own, capped per caller and in total
(issue 40): 50 open watches leave /healthz answering, and the ones over a cap are 429."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from common import keyspace
from common.store.connect import open_store
from controlplane.auth import ensure_token_secret, issue_token
from controlplane.watch_gate import PER_CALLER, TOTAL
from tests.controlplane.conftest import start_fabricd

WATCH_S = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with start_fabricd(tmp_path_factory.mktemp("watch-gate")) as srv:
        yield srv


def viewer_tokens(server, n: int) -> list[str]:
    store = open_store(None, server.state_dir)
    try:
        secret = ensure_token_secret(store)
    finally:
        store.close()
    return [issue_token(secret, f"watcher-{i}", 600, role="viewer")[0] for i in range(n)]


def test_fifty_watches_leave_healthz_answering_and_the_extra_ones_are_429(server):
    tokens = viewer_tokens(server, 15)  # 15 viewers x 4 = 60 asked; the total is 32

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     limits=httpx.Limits(max_connections=80)) as client:
            start = (await client.get("/api/ai/watch/events", params={"revision": 0},
                                      headers={"authorization": f"Bearer {tokens[0]}"})).json()["revision"]

            async def one(token):
                return await client.get("/api/ai/watch/deployments", params={"revision": start, "timeout": WATCH_S},
                                        headers={"authorization": f"Bearer {token}"})

            # 50 watches: the first viewer asks for 8 (over its own cap), the others for 3 each.
            asks = [tokens[0]] * 8 + [t for t in tokens[1:] for _ in range(3)]
            watches = [asyncio.create_task(one(t)) for t in asks[:50]]
            await asyncio.sleep(0)
            health = []
            while not all(w.done() for w in watches) and len(health) < 5:
                health.append(((await client.get("/healthz")).status_code, sum(not w.done() for w in watches)))
            return asks[:50], [await w for w in watches], health

    asks, answers, health = asyncio.run(scenario())
    assert health and all(status == 200 for status, _ in health)
    assert any(pending > 0 for _, pending in health)  # answered while watches were still open
    served = [r for r in answers if r.status_code == 200]
    refused = [r for r in answers if r.status_code == 429]
    assert len(served) + len(refused) == 50 and len(served) <= TOTAL
    codes = {r.json()["error"]["code"] for r in refused}
    assert codes <= {"too_many_watches", "watches_full"} and "too_many_watches" in codes
    mine = [r for t, r in zip(asks, answers) if t == tokens[0] and r.status_code == 200]
    assert len(mine) <= PER_CALLER
    assert all(r.headers.get("retry-after") for r in refused)
    assert all(r.json()["changes"] == [] for r in served)


def test_a_watch_still_returns_a_change(server):
    token = viewer_tokens(server, 1)[0]
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        start = c.get("/api/ai/watch/models", params={"revision": 0}, headers=headers).json()["revision"]
        store = open_store(None, server.state_dir)
        try:
            store.put(keyspace.models("watched"), '{"name": "watched"}')
        finally:
            store.close()
        got = c.get("/api/ai/watch/models", params={"revision": start, "timeout": 10}, headers=headers).json()
        assert [ch["name"] for ch in got["changes"]] == ["watched"]
