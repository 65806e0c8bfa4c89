"""The gateway as a real process in front of real fabric-engine-sim processes, driven by the
official openai client: every auth path, streaming, disconnects, upstream death, audit, logs."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from common import apikeys, audit_chain
from common.records import api_keys
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import (
    HMAC_SECRET,
    GatewayProcess,
    engine_running,
    make_key,
    publish_endpoint,
    sim_engine,
    sqlite_state,
)

PROMPT = "the secret prompt says zebra-quartz-4411 and nothing else"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "gw")
    fast = sim_engine("--embedding-dim", "8")
    slow = sim_engine(tokens_per_s=20)
    doomed = sim_engine(tokens_per_s=20)
    publish_endpoint(store, "chat", [fast])
    publish_endpoint(store, "other", [fast])
    publish_endpoint(store, "slow", [slow])
    publish_endpoint(store, "doomed", [doomed])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    yield {"store": store, "gw": gw, "fast": fast, "slow": slow, "doomed": doomed, "keys": []}
    gw.stop()
    for e in (fast, slow, doomed):
        e.stop()
    store.close()


def client(env, endpoint: str, key: str, **kw) -> openai.OpenAI:
    env["keys"].append(key)
    return openai.OpenAI(base_url=env["gw"].openai_base(endpoint), api_key=key, max_retries=0, **kw)


def test_chat_streaming_and_not_completions_and_embeddings(env):
    _, key = make_key(env["store"], "chat")
    c = client(env, "chat", key)
    out = c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": PROMPT}], max_tokens=5)
    assert out.choices[0].message.content and out.usage.completion_tokens == 5
    chunks = list(c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True}))
    assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert c.completions.create(model="sim-m", prompt=PROMPT, max_tokens=3).choices[0].text
    emb = c.embeddings.create(model="sim-m", input=["a", "b"])
    assert len(emb.data) == 2 and len(emb.data[0].embedding) == 8


def _status(env, endpoint, headers, body=None):
    r = httpx.post(env["gw"].openai_base(endpoint) + "/chat/completions", headers=headers,
                   json=body or {"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    return r.status_code, r.json()["error"]["code"] if r.status_code >= 400 else None


def test_refusals_have_openai_error_shape_and_right_status(env):
    store = env["store"]
    assert _status(env, "chat", {}) == (401, "missing_api_key")
    assert _status(env, "chat", {"authorization": "Bearer fvai_000000000000_nope"}) == (401, "invalid_api_key")
    assert _status(env, "chat", {"authorization": "Bearer not-a-key"})[0] == 401
    _, key = make_key(store, "chat")
    prefix = apikeys.parse_key(key)
    wrong_secret = f"fvai_{prefix}_{'x' * 43}"
    assert _status(env, "chat", {"authorization": f"Bearer {wrong_secret}"}) == (401, "invalid_api_key")
    _, other_key = make_key(store, "other")
    assert _status(env, "chat", {"authorization": f"Bearer {other_key}"}) == (403, "endpoint_not_allowed")
    _, model_key = make_key(store, "chat", model="other-model")
    assert _status(env, "chat", {"authorization": f"Bearer {model_key}"}) == (403, "model_not_allowed")
    with pytest.raises(openai.PermissionDeniedError):
        client(env, "chat", model_key).chat.completions.create(model="sim-m", messages=[{"role": "user",
                                                                                          "content": "x"}])
    record, expired = apikeys.build_record(apikeys.KeySpec(name="old", endpoint="chat", ttl_secs=60),
                                           HMAC_SECRET.encode(), now=time.time() - 120)
    api_keys.save_new(store, record)
    assert _status(env, "chat", {"authorization": f"Bearer {expired}"}) == (401, "expired_api_key")
    r = httpx.post(env["gw"].openai_base("chat") + "/chat/completions", content=b"x" * (1024 * 1024 + 10),
                   headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    assert r.status_code == 413
    assert _status(env, "missing", {"authorization": f"Bearer {key}"})[0] in (403, 404)
    env["keys"] += [key, other_key, model_key, expired, wrong_secret]


def test_admin_token_is_never_accepted(env):
    from controlplane.auth import ensure_token_secret, issue_token

    token, _ = issue_token(ensure_token_secret(env["store"]), "admin", 600)
    assert _status(env, "chat", {"authorization": f"Bearer {token}"})[0] == 401


def test_rotation_keeps_old_secret_during_overlap_only(env):
    store = env["store"]
    key_id, old = make_key(store, "chat")
    _, new = apikeys.rotate_key(store, key_id, HMAC_SECRET.encode(), overlap_secs=3600)
    time.sleep(0.3)  # past the gateway's 0.2 s key cache
    assert _status(env, "chat", {"authorization": f"Bearer {old}"})[0] == 200
    assert _status(env, "chat", {"authorization": f"Bearer {new}"})[0] == 200
    _, newest = apikeys.rotate_key(store, key_id, HMAC_SECRET.encode(), overlap_secs=0)
    time.sleep(0.3)
    assert _status(env, "chat", {"authorization": f"Bearer {new}"})[0] == 401
    assert _status(env, "chat", {"authorization": f"Bearer {old}"})[0] == 401
    assert _status(env, "chat", {"authorization": f"Bearer {newest}"})[0] == 200
    api_keys.delete(store, key_id)
    time.sleep(0.3)
    assert _status(env, "chat", {"authorization": f"Bearer {newest}"})[0] == 401
    env["keys"] += [old, new, newest]


def test_client_disconnect_cancels_upstream(env):
    _, key = make_key(env["store"], "slow")
    env["keys"].append(key)
    body = {"model": "sim-m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400, "stream": True}
    with httpx.Client(timeout=10) as h, \
            h.stream("POST", env["gw"].openai_base("slow") + "/chat/completions", json=body,
                     headers={"authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200
        chunks = r.iter_raw()
        for _ in range(3):  # past the role chunk, which the engine sends before scheduling
            next(chunks)
        assert engine_running(env["slow"]) == 1
    # Closed: the engine must see the request go within a second (bounded poll, not a timing assert).
    wait_for(lambda: engine_running(env["slow"]) == 0, 1.0, "the engine to see the request go", interval=0.05)


def _rows(store, n: int, timeout: float = 5.0) -> list[dict]:
    return wait_for(lambda: rows if len(rows := audit_chain.read_rows(store)) >= n else None, timeout,
                    f"{n} audit rows", interval=0.05)


def test_upstream_death_mid_stream_errors_the_client_and_audits_failed(env):
    key_id, key = make_key(env["store"], "doomed")
    c = client(env, "doomed", key)
    stream = c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": PROMPT}],
                                       max_tokens=400, stream=True)
    with pytest.raises(openai.APIError):
        for i, _chunk in enumerate(stream):
            if i == 1:
                env["doomed"].proc.kill()
    failed = wait_for(lambda: [r for r in audit_chain.read_rows(env["store"])
                               if r["key_id"] == key_id and r["kind"] == "FAILED"], 5, "a FAILED audit row", interval=0.05)
    assert failed[0]["status"] == 502


def test_audit_chain_verifies_and_holds_no_key_or_prompt_and_logs_neither(env):
    rows = _rows(env["store"], 10)
    kinds = {r["kind"] for r in rows}
    assert {"ATTEMPT", "SUCCESS", "FAILED"} <= kinds
    assert audit_chain.verify(env["store"]).ok
    text = json.dumps(rows) + env["gw"].log_text()
    assert "zebra-quartz" not in text
    assert env["keys"] and all(k not in text for k in env["keys"])
    assert all(apikeys.parse_key(k) + "_" not in text for k in env["keys"] )


def test_metrics_count_outcomes_with_catalogue_labels(env):
    text = httpx.get(env["gw"].url + "/metrics").text
    assert 'fabric_gateway_requests_total{endpoint="chat",outcome="success"}' in text
    assert 'outcome="unauthorized"' in text
    assert 'endpoint="missing"' not in text
    # how long ago the streamed readings were confirmed: within ten refreshes of the views it served
    age = [float(line.split()[-1]) for line in text.splitlines()
           if line.startswith("fabric_gateway_readings_age_seconds ")]
    assert len(age) == 1 and 0.0 <= age[0] < 600, age


def test_a_call_past_its_deadline_is_answered_504_and_audited(env):
    """x-request-timeout bounds the upstream call (gateway.deadlines): a generation that would
    take ~5 s is cut at 1 s, answered 504 in the error shape, and audited FAILED."""
    key_id, key = make_key(env["store"], "slow")
    env["keys"].append(key)
    body = {"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    r = httpx.post(env["gw"].openai_base("slow") + "/chat/completions", json=body, timeout=30,
                   headers={"authorization": f"Bearer {key}", "x-request-timeout": "1"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    assert r.headers["x-fabric-request-id"]  # explainable like every other refusal
    failed = wait_for(lambda: [x for x in audit_chain.read_rows(env["store"])  # the audit writer drains every 10 ms
                               if x.get("key_id") == key_id and x["kind"] == "FAILED"], 5, "a FAILED audit row",
                      interval=0.05)
    assert failed[0]["status"] == 504
    assert failed[0]["request_id"] == r.headers["x-fabric-request-id"]
