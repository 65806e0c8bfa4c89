"""Gateway refusals that point at the fix (issue 41), through a real gateway process, a real
engine simulator and the official openai client: a base URL without /v1, an endpoint name that
does not exist (not found, and only for a valid key), a request larger than the key's whole
tokens-per-minute allowance (it can never fit: no Retry-After)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "answers")
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    publish_endpoint(store, "other", [engine])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    yield {"store": store, "gw": gw}
    gw.stop()
    engine.stop()
    store.close()


BODY = {"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_base_url_without_v1_is_an_openai_404_naming_the_path(env):
    _, key = make_key(env["store"], "chat")
    base = env["gw"].openai_base("chat").removesuffix("/v1")
    r = httpx.post(base + "/chat/completions", json=BODY, headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "not_found" and "send /v1/chat/completions" in err["message"], err
    assert "base URL should end in /v1" in err["message"]
    with pytest.raises(openai.NotFoundError, match="/v1/chat/completions"):
        openai.OpenAI(base_url=base, api_key=key, max_retries=0).chat.completions.create(**BODY)


def test_an_unknown_endpoint_is_not_found_for_a_valid_key_and_unauthorized_without_one(env):
    _, key = make_key(env["store"], "chat")
    r = httpx.post(env["gw"].openai_base("chta") + "/chat/completions", json=BODY,
                   headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "endpoint_not_found", r.text
    assert "endpoint 'chta' not found" in r.json()["error"]["message"]
    # An endpoint that exists but is not the key's stays a permissions refusal.
    r = httpx.post(env["gw"].openai_base("other") + "/chat/completions", json=BODY,
                   headers={"authorization": f"Bearer {key}"})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "endpoint_not_allowed")
    # Without a valid key the answer is the same 401 whether the endpoint exists or not.
    for name in ("chta", "other"):
        for headers in ({}, {"authorization": "Bearer fvai_000000000000_" + "x" * 43}):
            r = httpx.post(env["gw"].openai_base(name) + "/chat/completions", json=BODY, headers=headers)
            assert r.status_code == 401, (name, headers, r.text)


def test_a_request_bigger_than_the_keys_tpm_can_never_fit(env):
    _, key = make_key(env["store"], "chat", tokens_per_minute=50)
    r = httpx.post(env["gw"].openai_base("chat") + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                   json={**BODY, "max_tokens": 200})
    assert r.status_code == 400 and "retry-after" not in r.headers, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and "can never fit" in err["message"]
    assert "tokens_per_minute allows in a minute (50)" in err["message"]
    # One that fits the minute still passes (and a second then waits for the window, as before).
    ok = httpx.post(env["gw"].openai_base("chat") + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                    json=BODY)
    assert ok.status_code == 200, ok.text
