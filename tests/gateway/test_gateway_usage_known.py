"""Usage always known (issue 37), through a real gateway, a real engine simulator and the
official openai client: a stream that did not ask for usage is charged its exact usage (the
gateway asked the engine for it) while the client receives the same bytes the engine sends
without it; a client that asked still gets its usage chunk; the stripping holds whatever the
chunk boundaries."""

from __future__ import annotations

import json
import random
import re

import httpx
import openai
import pytest

from gateway.request_body import BodyInfo
from gateway.usage_inject import UsageStripper, fallback_tokens, inject
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import (
    GatewayProcess,
    make_key,
    publish_endpoint,
    sim_engine,
    sqlite_state,
    tpm_used,
)

MSG = [{"role": "user", "content": "hello there"}]
UNSTABLE = re.compile(rb'"(id|created)":\s*("[^"]*"|\d+)')


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "usage-known")
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    yield {"store": store, "gw": gw, "engine": engine}
    gw.stop()
    engine.stop()
    store.close()


def test_a_stream_without_include_usage_is_charged_exactly_and_sees_the_engines_bytes(env):
    key_id, key = make_key(env["store"], "chat", tokens_per_minute=100000)
    body = {"model": "sim-m", "messages": MSG, "max_tokens": 9, "stream": True}
    with httpx.stream("POST", env["gw"].openai_base("chat") + "/chat/completions", json=body,
                      headers={"authorization": f"Bearer {key}"}) as r:
        via_gateway = b"".join(r.iter_raw())
    direct = httpx.post(env["engine"].url + "/v1/chat/completions", json=body).content
    assert b'"usage"' not in via_gateway and via_gateway.endswith(b"data: [DONE]\n\n")
    assert UNSTABLE.sub(b"", via_gateway) == UNSTABLE.sub(b"", direct)
    asked = httpx.post(env["engine"].url + "/v1/chat/completions",
                       json={**body, "stream_options": {"include_usage": True}}).text
    usage = [json.loads(line[5:])["usage"] for line in asked.splitlines()
             if line.startswith("data: {") and '"usage"' in line][-1]
    # settled in the call's finally, after the last byte
    wait_for(lambda: tpm_used(env["store"], key_id) == usage["total_tokens"], 5, "the call's tokens to settle",
             interval=0.05)


def test_a_client_that_asks_for_usage_still_gets_it(env):
    _, key = make_key(env["store"], "chat")
    c = openai.OpenAI(base_url=env["gw"].openai_base("chat"), api_key=key, max_retries=0)
    chunks = list(c.chat.completions.create(model="sim-m", messages=MSG, max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    plain = list(c.chat.completions.create(model="sim-m", messages=MSG, max_tokens=5, stream=True))
    assert all(ch.usage is None for ch in plain) and "".join(
        ch.choices[0].delta.content or "" for ch in plain if ch.choices)


def test_the_stripper_holds_whatever_the_chunk_boundaries():
    events = [b'data: {"id":"a","choices":[{"delta":{"content":"x"}}]}\n\n',
              b'data: {"id":"a","choices":[{"delta":{"content":"y"}}],"usage":null}\n\n',
              b'data: {"id":"a","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n',
              b"data: [DONE]\n\n"]
    stream = b"".join(events)
    want = stream.replace(events[2], b"")
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(0, 12)))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        s = UsageStripper()
        out = b"".join(s.feed(p) for p in pieces) + s.flush()
        assert out == want and s.stripped == 1


def test_which_bodies_are_rewritten_and_the_fallback_charge():
    data = {"model": "m", "stream": True, "messages": []}
    raw = json.dumps(data).encode()
    info = BodyInfo(model="m", stream=True, max_tokens=4, choices=2, data=data)
    asked = json.loads(inject(info, raw, "/v1/chat/completions"))
    assert asked["stream_options"] == {"include_usage": True}
    with_opts = {**data, "stream_options": {"continuous_usage_stats": False}}
    info2 = BodyInfo(model="m", stream=True, data=with_opts)
    assert json.loads(inject(info2, json.dumps(with_opts).encode(), "/v1/completions"))["stream_options"] == {
        "continuous_usage_stats": False, "include_usage": True}
    already = {**data, "stream_options": {"include_usage": True}}
    assert inject(BodyInfo(stream=True, data=already), b"{}", "/v1/chat/completions") is None
    assert inject(BodyInfo(stream=False, data=data), raw, "/v1/chat/completions") is None
    assert inject(info, raw, "/v1/embeddings") is None
    assert fallback_tokens(info) == 8 and fallback_tokens(BodyInfo()) == 1
