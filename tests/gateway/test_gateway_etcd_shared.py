"""Two gateway processes on one real etcd share every limit: no over-admission across them.

The etcd is secured as in production (TLS with client certificates, auth on): the test writes the
endpoint and keys as fabricd does, and the gateways log in as `gateway`, whose role reads and
writes only what a gateway needs, so everything below also proves that role is enough."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from common import audit_chain
from lab.rigs.etcd_server import ETCD_BINARY, EtcdServer, etcd_available
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    if not etcd_available():
        pytest.skip(f"etcd binary not found at {ETCD_BINARY}")
    state = tmp_path_factory.mktemp("etcdgw")
    with EtcdServer() as etcd:
        store = etcd.open("fabricd")
        with sim_engine() as eng:
            publish_endpoint(store, "chat", [eng])
            env = {"FABRIC_USER_RPM": "15", **etcd.env("gateway")}
            a = GatewayProcess.start(state, etcd.url, env, gateway_id="gw-a")
            b = GatewayProcess.start(state, etcd.url, env, gateway_id="gw-b")
            try:
                yield store, a, b
            finally:
                a.stop()
                b.stop()
                store.close()


async def split_burst(urls: list[str], key: str, n: int, user: str | None = None) -> list[int]:
    body = {"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n), timeout=60) as http:
        async def one(i: int) -> int:
            r = await http.post(urls[i % len(urls)] + "/chat/completions", json=body,
                                headers={"authorization": f"Bearer {key}", **({"x-user-id": user} if user else {})})
            return r.status_code

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_two_gateways_share_the_quota_exactly(pair):
    store, a, b = pair
    _, key = make_key(store, "chat", request_quota=25)
    codes = asyncio.run(split_burst([a.openai_base("chat"), b.openai_base("chat")], key, 60))
    assert codes.count(200) == 25 and codes.count(429) == 35


def test_two_gateways_share_one_rpm_window_and_one_audit_chain(pair):
    store, a, b = pair
    _, key = make_key(store, "chat")
    for attempt in range(2):
        # A fixed one-minute window: a burst that straddles a minute boundary legitimately gets a
        # second allowance, so such a run is repeated with a fresh user rather than misjudged.
        minute = int(time.time() // 60)
        codes = asyncio.run(split_burst([a.openai_base("chat"), b.openai_base("chat")], key, 30, f"u{attempt}"))
        if int(time.time() // 60) == minute:
            break
    assert codes.count(200) == 15 and codes.count(429) == 15
    rows_expected = 2 * (60 + 30 * (attempt + 1))
    wait_for(lambda: len(audit_chain.read_rows(store)) >= rows_expected, 10, f"{rows_expected} audit rows",
             interval=0.1)
    result = audit_chain.verify(store)
    assert result.ok and result.rows == rows_expected
