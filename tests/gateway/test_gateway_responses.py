"""POST /v1/responses through a real gateway to the engine simulator, with the official openai
client (issue 37): the same auth, limits, usage and audit as chat completions, plain and
streamed (the Responses API's usage is input_tokens/output_tokens, in a stream inside the final
event's ``response.usage``; the stream has no [DONE] and is not taken as cut)."""

from __future__ import annotations

import openai
import pytest

from common import audit_chain
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import (
    GatewayProcess,
    make_key,
    publish_endpoint,
    sim_engine,
    sqlite_state,
    tpm_used,
)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "responses")
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    yield {"store": store, "gw": gw}
    gw.stop()
    engine.stop()
    store.close()


def _client(env, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=env["gw"].openai_base("chat"), api_key=key, max_retries=0)


def _settled(env, key_id: str, want: int) -> int:
    wait_for(lambda: tpm_used(env["store"], key_id) == want,
             5, f"{key_id}'s tokens to settle at {want}", interval=0.05)
    return tpm_used(env["store"], key_id)


def _audited(env, key_id: str, kind: str) -> list[dict]:
    return wait_for(lambda: [r for r in audit_chain.read_rows(env["store"]) if r.get("key_id") == key_id
                             and kind in r.values()], 10, f"a {kind} audit row of {key_id}", interval=0.1)


def test_a_plain_response_is_charged_its_usage_and_audited(env):
    key_id, key = make_key(env["store"], "chat", tokens_per_minute=10_000)
    r = _client(env, key).responses.create(model="sim-m", input="hello there", max_output_tokens=6)
    assert r.output_text and r.usage.output_tokens == 6
    assert _settled(env, key_id, r.usage.total_tokens) == r.usage.total_tokens
    rows = _audited(env, key_id, "SUCCESS")
    assert [row["tokens"] for row in rows] == [r.usage.total_tokens]


def test_a_streamed_response_ends_cleanly_and_is_charged_its_final_usage(env):
    key_id, key = make_key(env["store"], "chat", tokens_per_minute=10_000)
    events = list(_client(env, key).responses.create(model="sim-m", input=[{"role": "user", "content": "hi"}],
                                                     max_output_tokens=7, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.usage.output_tokens == 7
    assert sum(1 for e in events if e.type == "response.output_text.delta") == 7
    total = events[-1].response.usage.total_tokens
    assert _settled(env, key_id, total) == total
    rows = _audited(env, key_id, "SUCCESS")  # a clean end: not FAILED as upstream_cut
    assert [row["tokens"] for row in rows] == [total]


def test_responses_are_refused_as_chat_completions_are(env):
    with pytest.raises(openai.AuthenticationError):
        _client(env, "fk_nope_nope").responses.create(model="sim-m", input="hi")
    _, key = make_key(env["store"], "chat", tokens_per_minute=50)
    with pytest.raises(openai.BadRequestError) as err:  # more than the key's whole minute
        _client(env, key).responses.create(model="sim-m", input="hi", max_output_tokens=100)
    assert err.value.code == "request_too_large"
    _, scoped = make_key(env["store"], "chat", model="other-model")
    with pytest.raises(openai.PermissionDeniedError):
        _client(env, scoped).responses.create(model="sim-m", input="hi")
