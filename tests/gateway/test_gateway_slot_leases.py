"""In-flight slots survive a crash: three real gateway processes share one store; one is killed
with SIGKILL while 64 streaming clients hold slots. Its slots come back once its lease expires
(FABRIC_GATEWAY_SLOT_LEASE_SECS), never before, and the survivors never admit more than the
limit. Also: windows are written under a lease (unused caller-named counters disappear), and
`fabric-gateway slots` shows holders and their slots."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from common import keyspace
from common.records import counters
from gateway.slots import slot_view
from lab.rigs.polling import wait_for, wait_for_async
from tests.gateway.gateway_harness import (
    GatewayProcess,
    engine_running,
    make_key,
    publish_endpoint,
    sim_engine,
    sqlite_state,
)

LIMIT = 40
LEASE = 3
ENV = {"FABRIC_GLOBAL_STREAMS": str(LIMIT), "FABRIC_GATEWAY_SLOT_LEASE_SECS": str(LEASE),
       "FABRIC_USER_RPM": "1000", "FABRIC_GATEWAY_CACHE_SECS": "0.2"}
GLOBAL = "streams/global/all"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "slots")
    engine = sim_engine("--max-num-seqs", "256", tokens_per_s=20)
    publish_endpoint(store, "chat", [engine])
    gws = [GatewayProcess.start(state, url, ENV, gateway_id=f"gw-{n}") for n in "abc"]
    _, key = make_key(store, "chat")
    yield {"store": store, "gws": gws, "key": key, "engine": engine, "state": state, "url": url}
    for gw in gws:
        gw.stop()
    engine.stop()
    store.close()


async def stream(base: str, key: str, statuses: list, max_tokens: int = 4000) -> None:
    body = {"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "stream": True}
    try:
        async with httpx.AsyncClient(timeout=60) as http, http.stream(
                "POST", base + "/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}) as r:
            statuses.append((base, r.status_code))
            async for _ in r.aiter_raw():
                pass
    except httpx.HTTPError:
        pass  # the killed gateway's clients


def global_in_flight(store) -> int:
    view = slot_view(store)
    return next((c["in_flight"] for c in view["counters"] if c["counter"] == GLOBAL), 0)


async def wait_statuses(statuses: list, n: int) -> None:
    await wait_for_async(lambda: len(statuses) >= n, 30, f"{n} streams to answer", interval=0.05)


def test_sigkilled_gateway_gives_its_slots_back_and_survivors_never_over_admit(env):
    a, b, c = env["gws"]
    store, key = env["store"], env["key"]

    async def scenario():
        statuses: list = []
        tasks = [asyncio.ensure_future(stream(gw.openai_base("chat"), key, statuses))
                 for i in range(64) for gw in [(a, b, c)[i % 3]]]
        await wait_statuses(statuses, 64)
        codes = [s for _, s in statuses]
        assert codes.count(200) == LIMIT and codes.count(429) == 64 - LIMIT
        held_by_a = sum(1 for base, s in statuses if s == 200 and base == a.openai_base("chat"))
        assert held_by_a > 0
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
        killed_at = time.monotonic()
        # A's slots still count until its lease expires: nothing is admitted early.
        early: list = []
        await stream(b.openai_base("chat"), key, early, max_tokens=1)
        assert early[0][1] == 429
        while global_in_flight(store) != LIMIT - held_by_a:
            assert time.monotonic() - killed_at < 6 * LEASE, slot_view(store)
            await asyncio.sleep(0.1)
        returned_after = time.monotonic() - killed_at
        print(f"slots of the killed gateway returned after {returned_after:.1f}s (lease {LEASE}s)")
        # The survivors fill exactly the freed slots, never more.
        peak, stop = [0.0], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], engine_running(env["engine"]))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        more: list = []
        tasks2 = [asyncio.ensure_future(stream(gw.openai_base("chat"), key, more))
                  for i in range(40) for gw in [(b, c)[i % 2]]]
        try:
            await wait_statuses(more, 40)
            await asyncio.sleep(0.5)
        finally:
            stop.set()
            sampler.join()
        assert [s for _, s in more].count(200) == held_by_a
        assert global_in_flight(store) == LIMIT
        assert 0 < peak[0] <= LIMIT
        view = slot_view(store)
        holders = next(x for x in view["counters"] if x["counter"] == GLOBAL)["holders"]
        assert all(h["alive"] for h in holders.values()) and not any(h.startswith("gw-a-") for h in holders)
        for t in tasks + tasks2:
            t.cancel()
        await asyncio.gather(*tasks, *tasks2, return_exceptions=True)

    asyncio.run(scenario())
    # Every slot is released when the streams end: the counter key is deleted, not left at 0.
    wait_for(lambda: store.get(keyspace.counters("slots/" + GLOBAL)) is None, 20, "the slot counter key to go",
             interval=0.1)


def test_slots_command_shows_holders(env):
    out = subprocess.run([sys.executable, "-m", "gateway.cli", "slots", "--state-dir", str(env["state"]),
                          "--store", env["url"]], capture_output=True, text=True, timeout=30, check=True)
    view = json.loads(out.stdout)
    assert any(h.startswith("gw-b-") for h in view["holders"]) and any(h.startswith("gw-c-") for h in view["holders"])


def test_windows_are_written_under_a_lease(env):
    _, _, c = env["gws"]
    r = httpx.post(c.openai_base("chat") + "/chat/completions", headers={"authorization": f"Bearer {env['key']}",
                   "x-user-id": "lease-check"}, json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 1}, timeout=30)
    assert r.status_code == 200
    # The caller-named counter lives in its tenant's (or its key's) namespace.
    found = [kv for kv in env["store"].list(keyspace.counters("rpm/user/")) if kv.key.endswith("/lease-check")]
    assert len(found) == 1 and found[0].lease is not None


def test_a_window_disappears_with_its_lease(env):
    store = env["store"]
    lease = store.grant_lease(1)
    key = keyspace.counters("rpm/user/short-lived")
    assert counters.window_reserve(store, key, 1, 10, 60, time.time(), lease.id).ok
    assert store.get(key) is not None
    wait_for(lambda: store.get(key) is None, 10, "the leased counter to expire", interval=0.2)
