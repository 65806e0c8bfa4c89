"""Every limit through a real gateway process and the official openai client: lifetime quota and
max_concurrent exact under concurrency, per-scope RPM/TPM/streams, daily tokens, size caps,
shedding by queue depth and priority."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import httpx
import openai
import pytest

from common import keyspace
from common.schemas import ReplicaObservation
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import (
    GatewayProcess,
    engine_running,
    make_key,
    publish_endpoint,
    sim_engine,
    sqlite_state,
)
from tests.support.fake_clock import SUITE_CLOCK

LIMIT_ENV = {
    "FABRIC_GATEWAY_CACHE_SECS": "0.2",
    "FABRIC_USER_RPM": "3",
    "FABRIC_USER_STREAMS": "1",
    "FABRIC_PROJECT_TPM": "100",
    "FABRIC_MAX_PROMPT_TOKENS": "100",
    "FABRIC_MAX_GENERATED_TOKENS": "50",
    "FABRIC_MAX_CONTEXT": "120",
    "FABRIC_SHED_QUEUE": "2",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "limits")
    fast = sim_engine()
    slow = sim_engine("--max-num-seqs", "256", tokens_per_s=40)
    publish_endpoint(store, "chat", [fast])
    publish_endpoint(store, "slow", [slow])
    publish_endpoint(store, "shed", [fast])
    gw = GatewayProcess.start(state, url, LIMIT_ENV)
    yield {"store": store, "gw": gw, "fast": fast, "slow": slow, "state": state, "url": url}
    gw.stop()
    fast.stop()
    slow.stop()
    store.close()


def chat_body(max_tokens: int = 2, content: str = "hi", stream: bool = False) -> dict:
    return {"model": "sim-m", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": stream}


def post(env, endpoint, key, body=None, headers=None) -> httpx.Response:
    return httpx.post(env["gw"].openai_base(endpoint) + "/chat/completions", json=body or chat_body(),
                      headers={"authorization": f"Bearer {key}", **(headers or {})}, timeout=30)


async def burst(base: str, key: str, n: int, max_tokens: int = 2) -> list[int]:
    """n concurrent chat calls through the official async client; returns status codes."""
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n), timeout=60) as http:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, http_client=http)

        async def one() -> int:
            try:
                await client.chat.completions.create(model="sim-m", max_tokens=max_tokens,
                                                     messages=[{"role": "user", "content": "hi"}])
                return 200
            except openai.APIStatusError as exc:
                return exc.status_code

        return await asyncio.gather(*(one() for _ in range(n)))


def test_request_quota_is_exact_under_300_concurrent_calls(env):
    _, key = make_key(env["store"], "chat", request_quota=100)
    codes = asyncio.run(burst(env["gw"].openai_base("chat"), key, 300))
    assert codes.count(200) == 100
    assert codes.count(429) == 200
    assert post(env, "chat", key).status_code == 429


def test_max_concurrent_never_exceeded_upstream(env):
    _, key = make_key(env["store"], "slow", max_concurrent=10)
    peak, stop = [0.0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], engine_running(env["slow"]))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        # 40 tokens at 40 tokens/s: each admitted call runs about a second, so the sampler (one
        # /metrics fetch per pass, slow on a loaded machine) cannot miss every one of them.
        codes = asyncio.run(burst(env["gw"].openai_base("slow"), key, 200, max_tokens=40))
    finally:
        stop.set()
        sampler.join()
    assert codes.count(200) >= 10 and codes.count(200) + codes.count(429) == 200
    assert 0 < peak[0] <= 10
    assert engine_running(env["slow"]) == 0
    # Slots were all given back: a fresh call is admitted.
    assert post(env, "slow", key).status_code == 200


def test_user_rpm_window_refuses_with_retry_after(env):
    _, key = make_key(env["store"], "chat")
    codes = [post(env, "chat", key, headers={"x-user-id": "rpm-user"}).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    refused = post(env, "chat", key, headers={"x-user-id": "rpm-user"})
    # the seconds left in the window on the gateway's clock, which is the suite's fake one
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) == math.ceil(60 - SUITE_CLOCK.now % 60)
    assert refused.json()["error"]["message"].startswith("FABRIC_USER_RPM")
    assert post(env, "chat", key, headers={"x-user-id": "someone-else"}).status_code == 200
    assert post(env, "chat", key).status_code == 200  # no x-user-id: the user window does not apply
    SUITE_CLOCK.next_window()  # the next minute, without waiting for it
    assert post(env, "chat", key, headers={"x-user-id": "rpm-user"}).status_code == 200


def test_user_streams_cap_is_released_when_the_stream_ends(env):
    _, key = make_key(env["store"], "slow")
    hdr = {"authorization": f"Bearer {key}", "x-user-id": "streamer"}
    with httpx.Client(timeout=30) as h, \
            h.stream("POST", env["gw"].openai_base("slow") + "/chat/completions",
                     json=chat_body(50, stream=True), headers=hdr) as r:
        assert r.status_code == 200
        # Keep the iterator: a dropped httpx iterator closes the connection (the client leaves,
        # which frees the slot at once).
        chunks = r.iter_raw()
        next(chunks)
        second = h.post(env["gw"].openai_base("slow") + "/chat/completions", json=chat_body(), headers=hdr)
        assert second.status_code == 429, second.text
        assert "FABRIC_USER_STREAMS" in second.json()["error"]["message"]
    status = wait_for(lambda: (s := post(env, "slow", key, headers={"x-user-id": "streamer"}).status_code) != 429 and s,
                      5, "the user's stream slot to come back", interval=0.05)
    assert status == 200


def test_project_tpm_counts_upstream_usage(env):
    _, key = make_key(env["store"], "chat")
    hdr = {"x-project-id": "p1"}
    assert post(env, "chat", key, chat_body(40), hdr).status_code == 200
    assert post(env, "chat", key, chat_body(40), hdr).status_code == 200
    third = post(env, "chat", key, chat_body(40), hdr)
    assert third.status_code == 429 and "FABRIC_PROJECT_TPM" in third.json()["error"]["message"]
    assert post(env, "chat", key, chat_body(40), {"x-project-id": "p2"}).status_code == 200


def test_key_tokens_per_minute(env):
    _, key = make_key(env["store"], "chat", tokens_per_minute=60)
    assert post(env, "chat", key, chat_body(40)).status_code == 200
    assert post(env, "chat", key, chat_body(40)).status_code == 429


def test_prompt_generation_context_and_body_caps_are_400(env):
    _, key = make_key(env["store"], "chat")
    r = post(env, "chat", key, chat_body(2, "x" * 500))
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long"
    r = post(env, "chat", key, chat_body(60))
    assert r.status_code == 400 and r.json()["error"]["code"] == "max_tokens_too_large"
    r = post(env, "chat", key, chat_body(50, "x" * 300))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:
        openai.OpenAI(base_url=env["gw"].openai_base("chat"), api_key=key, max_retries=0).chat.completions.create(
            model="sim-m", messages=[{"role": "user", "content": "x" * 500}])
    assert exc.value.status_code == 400


def test_shedding_by_queue_depth_and_priority(env):
    _, key = make_key(env["store"], "shed", priority="high")  # high calls need a high key (a ceiling)
    _, plain = make_key(env["store"], "shed")
    obs = ReplicaObservation(replica_id="shed-dep-0", scraped_at=time.time(), ok=True, queue_depth=3)
    env["store"].put(keyspace.observations("shed-dep-0"), obs.model_dump_json())
    time.sleep(0.3)  # past the gateway's 0.2 s endpoint cache
    r = post(env, "shed", key, headers={"x-request-priority": "normal"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded"
    assert post(env, "shed", key, headers={"x-request-priority": "low"}).status_code == 429
    assert post(env, "shed", key, headers={"x-request-priority": "high"}).status_code == 200
    assert post(env, "shed", plain, headers={"x-request-priority": "high"}).status_code == 429  # served as normal
    assert post(env, "shed", key, headers={"x-request-priority": "urgent"}).status_code == 400
    env["store"].delete(keyspace.observations("shed-dep-0"))


def test_daily_tokens_bucket(env, tmp_path):
    gw = GatewayProcess.start(env["state"], env["url"], {"FABRIC_DAILY_TOKENS": "50"})
    try:
        _, key = make_key(env["store"], "chat")
        base = gw.openai_base("chat") + "/chat/completions"
        hdr = {"authorization": f"Bearer {key}"}
        assert httpx.post(base, json=chat_body(30), headers=hdr).status_code == 200
        r = httpx.post(base, json=chat_body(30), headers=hdr)
        assert r.status_code == 429 and "FABRIC_DAILY_TOKENS" in r.json()["error"]["message"]
    finally:
        gw.stop()
