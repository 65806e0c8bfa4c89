"""A stream stops at the budget (issue 37; gateway.live_budget).

Through a real gateway with the official openai client, against a loopback upstream that
streams past its max_tokens (an engine or provider that does not honour it): the key's
tokens_per_minute ends the stream with an OpenAI-shaped error event then [DONE], the counter is
settled at exactly what was relayed (the prompt estimate plus the tokens the client received),
and no slot is left held; with the limit in the key's shadow_limits the stream runs to its end
and the call is counted, audited and explained as one the limit would have refused.

In-process, with a moved clock: a stream that outlives its window (the key's TPM minute, the
tenant's FABRIC_TENANT_TPM minute, FABRIC_DAILY_TOKENS' day) is charged its further tokens in
the new window as they come, and is cut there at exactly the limit.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from common import apikeys, audit_chain, keyspace
from common.errors import InvalidInput
from common.records import counters
from common.store.connect import open_store
from gateway.limits import KEY_LIMITS, LimitKeeper, RequestFacts, key_shadowed, plan_admission
from gateway.live_budget import LiveBudget
from gateway.settings import GatewaySettings
from gateway.slots import SlotHolder, slot_view
from lab.rigs.polling import wait_for
from lab.rigs.routing_plans import publish_plans
from tests.gateway.gateway_harness import GatewayProcess, make_key, sqlite_state, tpm_used
from tests.support.fake_clock import FakeClock

MSG = [{"role": "user", "content": "hi"}]  # 2 characters: a prompt estimate of 1 token
STREAMED = 100  # content events the upstream sends, whatever max_tokens says


class Overrunning(BaseHTTPRequestHandler):
    """Streams STREAMED one-token chat chunks, then usage and [DONE], ignoring max_tokens (on
    /v1/responses: STREAMED output_text.delta events, then response.completed)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            if self.path.endswith("/responses"):
                self._responses()
                return
            for i in range(STREAMED):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                         "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
                self._chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                time.sleep(0.002)
            use = {"prompt_tokens": 1, "completion_tokens": STREAMED, "total_tokens": STREAMED + 1}
            self._chunk(b'data: {"id":"c","choices":[],"usage":' + json.dumps(use).encode() + b"}\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.server.cut_seen = True  # the gateway closed the upstream

    def _responses(self) -> None:
        for i in range(STREAMED):
            event = {"type": "response.output_text.delta", "sequence_number": i, "item_id": "m", "output_index": 0,
                     "content_index": 0, "delta": f"t{i} ", "logprobs": []}
            self._chunk(b"event: response.output_text.delta\ndata: " + json.dumps(event).encode() + b"\n\n")
            time.sleep(0.002)
        use = {"input_tokens": 1, "output_tokens": STREAMED, "total_tokens": STREAMED + 1}
        done = {"type": "response.completed", "sequence_number": STREAMED, "response": {"usage": use}}
        self._chunk(b"event: response.completed\ndata: " + json.dumps(done).encode() + b"\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from common.schemas import EndpointStatus, InferenceEndpoint, Replica

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Overrunning)
    upstream.cut_seen = False
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    state, url, store = sqlite_state(tmp_path_factory, "live-budget")
    ep = InferenceEndpoint(name="chat", deployment="chat-dep", status=EndpointStatus(phase="Ready"))
    store.put(keyspace.endpoints("chat"), ep.model_dump_json())
    rep = Replica(replica_id="chat-dep-0", deployment="chat-dep", ordinal=0, node="n1", host="127.0.0.1",
                  port=upstream.server_address[1], phase="Ready", ready=True)
    store.put(keyspace.replicas("chat-dep", rep.replica_id), rep.model_dump_json())
    publish_plans(store)  # the routing controller's plan: what the gateway routes on
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    yield {"store": store, "gw": gw, "upstream": upstream}
    gw.stop()
    upstream.shutdown()
    store.close()


def _settled(store, key_id: str, want: int) -> int:
    # settled in the call's finally, after the last byte
    wait_for(lambda: tpm_used(store, key_id) == want, 5, f"{key_id}'s tokens to settle at {want}", interval=0.05)
    return tpm_used(store, key_id)


def _in_flight(store) -> int:
    """Slots held, once the call's finally has had its moment (it releases after it settles)."""
    wait_for(lambda: sum(c["in_flight"] for c in slot_view(store)["counters"]) == 0, 5, "every slot released",
             interval=0.05)
    return sum(c["in_flight"] for c in slot_view(store)["counters"])


def test_the_stream_ends_at_the_keys_tpm_with_an_error_event_and_settles_exactly(env):
    key_id, key = make_key(env["store"], "chat", tokens_per_minute=60, max_concurrent=4)
    c = openai.OpenAI(base_url=env["gw"].openai_base("chat"), api_key=key, max_retries=0)
    received = 0
    with pytest.raises(openai.APIError) as err:
        for ch in c.chat.completions.create(model="m", messages=MSG, max_tokens=10, stream=True):
            received += sum(1 for choice in ch.choices if choice.delta.content)
    assert err.value.code == "rate_limited" and "tokens_per_minute (60)" in err.value.message
    assert received > 10  # past what admission held (prompt + max_tokens), to the limit
    assert _settled(env["store"], key_id, 1 + received) == 1 + received <= 60
    assert _in_flight(env["store"]) == 0
    # the upstream was closed, not read to its end
    wait_for(lambda: env["upstream"].cut_seen, 5, "the upstream to see the cut", interval=0.05)


def test_a_responses_stream_ends_at_the_budget_too(env):
    key_id, key = make_key(env["store"], "chat", tokens_per_minute=50)
    c = openai.OpenAI(base_url=env["gw"].openai_base("chat"), api_key=key, max_retries=0)
    received = 0
    with pytest.raises(openai.APIError) as err:
        for event in c.responses.create(model="m", input="hi", max_output_tokens=10, stream=True):
            received += event.type == "response.output_text.delta"
    assert err.value.code == "rate_limited" and received > 10
    assert _settled(env["store"], key_id, 1 + received) == 1 + received <= 50


def test_the_cut_stream_ends_with_done_on_the_wire(env):
    _, key = make_key(env["store"], "chat", tokens_per_minute=40)
    body = {"model": "m", "messages": MSG, "max_tokens": 10, "stream": True}
    with httpx.stream("POST", env["gw"].openai_base("chat") + "/chat/completions", json=body,
                      headers={"authorization": f"Bearer {key}"}) as r:
        raw = b"".join(r.iter_raw())
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert json.loads(events[-2][len(b"data: "):])["error"]["code"] == "rate_limited"
    assert all(json.loads(e[len(b"data: "):]).get("choices") for e in events[:-2])  # whole events only
    assert r.status_code == 200


def test_a_shadowed_key_limit_lets_the_stream_finish_and_reports_it(env):
    key_id, key = make_key(env["store"], "chat", tokens_per_minute=60, shadow_limits=("tokens_per_minute",))
    body = {"model": "m", "messages": MSG, "max_tokens": 10, "stream": True}
    with httpx.stream("POST", env["gw"].openai_base("chat") + "/chat/completions", json=body,
                      headers={"authorization": f"Bearer {key}"}) as r:
        raw = b"".join(r.iter_raw())
        request_id = r.headers["x-fabric-request-id"]
    assert raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
    assert raw.count(b'"content"') == STREAMED
    assert _settled(env["store"], key_id, STREAMED + 1) == STREAMED + 1  # the engine's usage
    explained = httpx.get(env["gw"].url + f"/api/ai/explain/request/{request_id}",
                          headers={"authorization": f"Bearer {key}"}).json()
    assert explained["would_refuse"] == [KEY_LIMITS["tokens_per_minute"]]
    rows = wait_for(lambda: [r for r in audit_chain.read_rows(env["store"])
                             if r.get("request_id") == request_id and r.get("kind", r.get("event")) != "ATTEMPT"
                             and r.get("would_refuse")], 10, "the call's shadow refusal in the audit", interval=0.1)
    assert rows[0]["would_refuse"] == KEY_LIMITS["tokens_per_minute"]
    metrics = httpx.get(env["gw"].url + "/metrics").text
    assert 'fabric_gateway_shadow_refusals_total{limit="the API key\'s tokens_per_minute"} 1.0' in metrics


# --- in-process: a stream that outlives its minute --------------------------------------------------

def _event(i: int) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n' % i


WINDOWS = [  # (settings, the call's key TPM, its tenant, the counter, the window, its limit's name)
    (GatewaySettings(), 100, None, "tpm/key/k1", 60, KEY_LIMITS["tokens_per_minute"]),
    (GatewaySettings(tpm={"TENANT": 100}), None, "acme", "tpm/tenant/acme", 60, "FABRIC_TENANT_TPM"),
    (GatewaySettings(daily_tokens=100), None, None, "daily-tokens", 86400, "FABRIC_DAILY_TOKENS"),
]


@pytest.mark.parametrize("settings,key_tpm,tenant,counter,window,what", WINDOWS)
def test_a_stream_that_outlives_its_window_is_charged_and_cut_in_the_next(tmp_path, settings, key_tpm, tenant,
                                                                          counter, window, what):
    store = open_store(f"sqlite://{tmp_path}/s.db")
    clock = FakeClock(tmp_path / "clock", window * 100 + window - 1.0)  # one second before a window ends
    keeper = LimitKeeper(store, SlotHolder(store, "gw"), clock=clock)
    facts = RequestFacts(endpoint="e", model="m", tenant=tenant, project=None, user=None, gateway_id="gw",
                         prompt_chars=40, max_tokens=50, key_id="k1", key_tokens_per_minute=key_tpm)
    key = keyspace.counters(counter)

    async def run() -> LiveBudget:
        admission = await keeper.admit(plan_admission(settings, facts), facts.token_estimate)
        budget = LiveBudget(keeper, admission, facts.prompt_tokens, "/v1/chat/completions")
        for i in range(5):  # within the first window's hold
            assert await budget.take(budget.feed(_event(i))[1])
        clock.now += 1.5  # the next window; others took 90 of its 100 tokens
        assert counters.window_reserve(store, key, 90, 100, window, clock.now).ok
        i = 5
        while await budget.take(budget.feed(_event(i))[1]):
            i += 1
        assert budget.generated == 15 and budget.cut_by == what
        await keeper.settle(admission, budget.used)
        return budget

    budget = asyncio.run(run())
    assert counters.window_read(store, key, window, clock.now) == 100  # exactly the limit: 90 + its 10
    assert budget.used == facts.prompt_tokens + 15
    store.close()


def test_a_keys_shadow_limits_are_checked_names():
    with pytest.raises(InvalidInput, match="shadow_limits"):
        apikeys.build_record(apikeys.KeySpec(name="k", endpoint="e", shadow_limits=("tpm",)), b"s")
    record, _ = apikeys.build_record(apikeys.KeySpec(name="k", endpoint="e", shadow_limits=(
        "tokens_per_minute", "FABRIC_TENANT_TPM", "tokens_per_minute")), b"s")
    assert record.shadow_limits == ["FABRIC_TENANT_TPM", "tokens_per_minute"]
    assert key_shadowed(record.shadow_limits) == {"FABRIC_TENANT_TPM", KEY_LIMITS["tokens_per_minute"]}


def test_token_counting_holds_whatever_the_chunk_boundaries(tmp_path):
    store = open_store(f"sqlite://{tmp_path}/s.db")
    keeper = LimitKeeper(store, SlotHolder(store, "gw"))
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    chat = role + b"".join(_event(i) for i in range(7)) + b'data: {"choices":[],"usage":{"total_tokens":9}}\n\n'
    text = b"".join(b'data: {"choices":[{"text":"w%d"}]}\n\n' % i for i in range(6))
    responses = (b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n'
                 + b"".join(b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                            b'"delta":"d%d"}\n\n' % i for i in range(5))
                 + b'event: response.output_text.done\ndata: {"type":"response.output_text.done","text":"x"}\n\n')
    rng = random.Random(3)
    for path, stream, want in (("/v1/chat/completions", chat, 7), ("/v1/completions", text, 6),
                               ("/v1/responses", responses, 5)):
        for _ in range(50):
            cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(0, 10)))
            budget = LiveBudget(keeper, _admission(), 0, path)
            out, n = b"", 0
            for a, b in zip([0, *cuts], [*cuts, len(stream)]):
                ready, k = budget.feed(stream[a:b])
                out, n = out + ready, n + k
            assert (out + budget.flush(), n) == (stream, want)
    store.close()


def _admission():
    from gateway.limits import Admission, Hold, Reservation

    r = Reservation("counters/x", 10, None, None, "x", tokens=True)  # no window: never extended
    return Admission([r], 10, holds=[Hold(r, 0, 10)])


def test_a_stream_its_upstream_cuts_is_charged_what_was_relayed(tmp_path):
    from common.http1_client import UpstreamPool
    from gateway.proxy import forward
    from tests.gateway.test_proxy_cut_upstream import RawServer, reset, two_events

    async def handler(server, reader, writer):
        await two_events(server, reader, writer)
        await asyncio.sleep(0.05)
        reset(writer)

    async def run():
        async def send(message):
            pass

        budget = LiveBudget(LimitKeeper(None, None), _admission(), 3, "/v1/chat/completions")
        async with RawServer(handler) as srv:
            result = await forward(UpstreamPool(idle_timeout=5), send, [f"http://127.0.0.1:{srv.port}"], "POST",
                                   b"/v1/chat/completions", [], b"{}", True, budget=budget)
        return result

    result = asyncio.run(run())
    assert result.cut and result.tokens == 3 + 2  # the prompt estimate and the two relayed tokens


def test_events_read_together_are_taken_one_by_one_up_to_the_limit(tmp_path):
    store = open_store(f"sqlite://{tmp_path}/s.db")
    keeper = LimitKeeper(store, SlotHolder(store, "gw"), clock=FakeClock(tmp_path / "clock", 6000.0))  # within one minute throughout
    facts = RequestFacts(endpoint="e", model="m", tenant=None, project=None, user=None, gateway_id="gw",
                         prompt_chars=4, max_tokens=5, key_id="k1", key_tokens_per_minute=20)

    async def run():
        admission = await keeper.admit(plan_admission(GatewaySettings(), facts), facts.token_estimate)
        budget = LiveBudget(keeper, admission, facts.prompt_tokens, "/v1/chat/completions")
        ready, n = budget.feed(b"".join(_event(i) for i in range(30)))  # one read of 30 tokens
        assert not budget.fits(n)
        relayed, going = await budget.take_events(ready, n)
        await keeper.settle(admission, budget.used)
        return budget, relayed, going

    budget, relayed, going = asyncio.run(run())
    assert not going and relayed == b"".join(_event(i) for i in range(19))  # 1 prompt token + 19 = 20
    assert budget.used == 20 and counters.window_read(store, keyspace.counters("tpm/key/k1"), 60, 6000.0) == 20
    store.close()
