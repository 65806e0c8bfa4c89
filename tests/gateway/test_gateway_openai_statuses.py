"""Every refusal the gateway makes, as OpenAI answers it (issue 37), through a real gateway
process, a real engine simulator and the official openai client: the SDK raises the class it
raises against OpenAI (it maps the status), 413 only for a body over FABRIC_GATEWAY_MAX_BODY,
429 with Retry-After and the x-ratelimit-* headers, which successful answers carry too."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.limits import Reservation
from gateway.ratelimit_headers import duration, headers_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "statuses")
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    publish_endpoint(store, "other", [engine])
    publish_endpoint(store, "empty", [])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2", "FABRIC_MAX_CONTEXT": "120",
                                           "FABRIC_MAX_GENERATED_TOKENS": "50", "FABRIC_USER_RPM": "3",
                                           "FABRIC_GATEWAY_MAX_BODY": "65536"})
    yield {"store": store, "gw": gw}
    gw.stop()
    engine.stop()
    store.close()


def client(env, key: str, endpoint: str = "chat") -> openai.OpenAI:
    return openai.OpenAI(base_url=env["gw"].openai_base(endpoint), api_key=key, max_retries=0)


def test_a_prompt_over_the_context_is_a_bad_request_with_openais_code(env):
    _, key = make_key(env["store"], "chat")
    with pytest.raises(openai.BadRequestError) as exc:
        client(env, key).chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "x" * 600}],
                                                 max_tokens=10)
    assert exc.value.status_code == 400 and exc.value.code == "context_length_exceeded", exc.value.body
    with pytest.raises(openai.BadRequestError) as exc:
        client(env, key).chat.completions.create(model="sim-m", messages=MSG, max_tokens=500)
    assert exc.value.code == "max_tokens_too_large"


def test_a_request_bigger_than_the_keys_minute_is_400_and_not_retried(env):
    _, key = make_key(env["store"], "chat", tokens_per_minute=20)
    with pytest.raises(openai.BadRequestError) as exc:
        client(env, key).chat.completions.create(model="sim-m", messages=MSG, max_tokens=40)
    assert exc.value.code == "request_too_large" and "retry-after" not in exc.value.response.headers


def test_bad_input_is_400_not_422(env):
    _, key = make_key(env["store"], "chat")
    with pytest.raises(openai.BadRequestError) as exc:
        client(env, key).chat.completions.create(model="sim-m", messages=MSG, max_tokens=2,
                                                 extra_headers={"x-request-priority": "urgent"})
    assert exc.value.status_code == 400 and "x-request-priority" in exc.value.message


def test_credentials_scope_and_names(env):
    _, key = make_key(env["store"], "chat")
    with pytest.raises(openai.AuthenticationError) as exc:
        client(env, "fvai_000000000000_" + "x" * 43).chat.completions.create(model="sim-m", messages=MSG)
    assert exc.value.status_code == 401
    with pytest.raises(openai.PermissionDeniedError):
        client(env, key, "other").chat.completions.create(model="sim-m", messages=MSG, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client(env, key, "nope").chat.completions.create(model="sim-m", messages=MSG, max_tokens=2)


def test_only_the_body_size_is_413(env):
    _, key = make_key(env["store"], "chat")
    with pytest.raises(openai.APIStatusError) as exc:
        client(env, key).chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "x" * 70000}],
                                                 max_tokens=2)
    assert exc.value.status_code == 413 and type(exc.value) is openai.APIStatusError


def test_no_ready_replica_is_503(env):
    _, key = make_key(env["store"], "empty")
    with pytest.raises(openai.InternalServerError) as exc:
        client(env, key, "empty").chat.completions.create(model="sim-m", messages=MSG, max_tokens=2)
    assert exc.value.status_code == 503


def test_answers_and_429s_carry_openais_rate_limit_headers(env):
    _, key = make_key(env["store"], "chat", tokens_per_minute=1000)
    c = client(env, key)
    seen = []
    for _ in range(3):
        raw = c.chat.completions.with_raw_response.create(model="sim-m", messages=MSG, max_tokens=2,
                                                          extra_headers={"x-user-id": "u-headers"})
        assert raw.parse().choices
        seen.append(raw.headers)
    h = seen[0]
    assert h["x-ratelimit-limit-requests"] == "3" and h["x-ratelimit-limit-tokens"] == "1000"
    assert [s["x-ratelimit-remaining-requests"] for s in seen] == ["2", "1", "0"]
    assert h["x-ratelimit-reset-requests"].endswith("s") and h["x-ratelimit-reset-tokens"].endswith("s")
    # Tokens: the first call reserved its estimate (1 prompt token + 2); later ones see it settled.
    assert int(h["x-ratelimit-remaining-tokens"]) <= 1000 - 3
    with pytest.raises(openai.RateLimitError) as exc:
        c.chat.completions.create(model="sim-m", messages=MSG, max_tokens=2, extra_headers={"x-user-id": "u-headers"})
    rh = exc.value.response.headers
    assert int(rh["retry-after"]) >= 1 and rh["x-ratelimit-remaining-requests"] == "0"
    assert rh["x-ratelimit-limit-requests"] == "3" and rh["x-ratelimit-reset-requests"].endswith("s")
    # A call under no limit carries none.
    r = httpx.post(env["gw"].openai_base("chat") + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                   json={"model": "sim-m", "messages": MSG, "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "1000"
    assert "x-ratelimit-limit-requests" not in r.headers  # no x-user-id: no user RPM applies


def test_header_values_pick_the_tightest_limit():
    rpm = Reservation("a", 1, 10, 60, "rpm")
    quota = Reservation("b", 1, 100, None, "quota")
    tpm = Reservation("c", 30, 1000, 60, "tpm", tokens=True)
    daily = Reservation("d", 30, 50, 86400, "daily", tokens=True)
    slot = Reservation("e", 1, 1, None, "streams", held=True)
    out = dict(headers_for([(rpm, 9), (quota, 5), (tpm, 30), (daily, 40), (slot, 1)], now=120.5))
    assert out[b"x-ratelimit-limit-requests"] == b"10" and out[b"x-ratelimit-remaining-requests"] == b"1"
    assert out[b"x-ratelimit-reset-requests"] == b"1m0s"
    assert out[b"x-ratelimit-limit-tokens"] == b"50" and out[b"x-ratelimit-remaining-tokens"] == b"10"
    assert out[b"x-ratelimit-reset-tokens"] == b"23h58m0s"
    assert dict(headers_for([(quota, 5)], now=120.5))[b"x-ratelimit-remaining-requests"] == b"95"
    assert b"x-ratelimit-reset-requests" not in dict(headers_for([(quota, 5)], now=120.5))
    assert duration(0.2) == "1s" and duration(360) == "6m0s" and duration(3723) == "1h2m3s"
