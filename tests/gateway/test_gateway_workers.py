"""`fabric-gateway serve --workers 2`: two worker processes on one port (SO_REUSEPORT) share
the store-held limits exactly, keep their per-process caches correct, report metrics summed
over both workers, extend one audit chain, and stop together."""

from __future__ import annotations

import asyncio
import os
import re

import httpx
import pytest

from common import audit_chain
from common.records import api_keys
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "workers")
    with sim_engine() as eng:
        publish_endpoint(store, "chat", [eng])
        gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.3"}, args=["--workers", "2"])
        try:
            yield {"store": store, "gw": gw}
        finally:
            gw.stop()
            store.close()


async def fresh_connections(url: str, key: str, n: int) -> list[int]:
    """n calls, each on its own connection so SO_REUSEPORT spreads them over the workers."""
    body = {"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    async def one() -> int:
        async with httpx.AsyncClient(timeout=60) as http:
            r = await http.post(url + "/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
            return r.status_code

    return await asyncio.gather(*(one() for _ in range(n)))


def worker_pids(gw: GatewayProcess) -> set[str]:
    return set(re.findall(r"Started server process \[(\d+)\]", gw.log_text()))


def test_two_workers_share_the_quota_exactly_and_sum_metrics(env):
    gw = env["gw"]
    # /health answered once the first worker was up
    wait_for(lambda: len(worker_pids(gw)) >= 2, 15, "the second worker", interval=0.05)
    assert len(worker_pids(gw)) == 2
    _, key = make_key(env["store"], "chat", request_quota=20)
    codes = asyncio.run(fresh_connections(gw.openai_base("chat"), key, 60))
    assert codes.count(200) == 20 and codes.count(429) == 40
    # Whichever worker answers the scrape, it reports the sum over both.
    for _ in range(4):
        with httpx.Client() as fresh:
            text = fresh.get(gw.url + "/metrics").text
        success = re.search(r'fabric_gateway_requests_total\{endpoint="chat",outcome="success"\} (\S+)', text)
        limited = re.search(r'fabric_gateway_requests_total\{endpoint="chat",outcome="rate_limited"\} (\S+)', text)
        assert success and float(success.group(1)) == 20
        assert limited and float(limited.group(1)) == 40


def test_a_deleted_key_stops_working_in_every_worker_within_the_cache_ttl(env):
    gw = env["gw"]
    key_id, key = make_key(env["store"], "chat")
    assert set(asyncio.run(fresh_connections(gw.openai_base("chat"), key, 8))) == {200}
    api_keys.delete(env["store"], key_id)
    asyncio.run(asyncio.sleep(0.5))
    assert set(asyncio.run(fresh_connections(gw.openai_base("chat"), key, 8))) == {401}


def test_both_workers_extend_one_audit_chain_and_stop_together(env, tmp_path):
    gw = env["gw"]
    result = audit_chain.verify(env["store"])
    assert result.ok and result.rows > 0
    gw.stop()
    assert gw.proc.returncode == 0
    for pid in worker_pids(gw):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
