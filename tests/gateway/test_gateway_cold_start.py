"""Cold start through a real fabric-gateway process: a call for an endpoint with no ready replica
records demand in the store and, by default, is held until a replica is Ready (a streamed one
with SSE keep-alive comments), within bounds per endpoint and tenant; with a hold of 0 (the
endpoint's hold_secs, or FABRIC_GATEWAY_HOLD_SECS) it gets 503 + Retry-After + an OpenAI-style
"model_loading" error at once, which the official openai client retries on its own."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from common import keyspace
from common.schemas import (
    AutoscalingSpec,
    DeploymentStatus,
    EndpointStatus,
    InferenceDeployment,
    InferenceEndpoint,
)
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state


@pytest.fixture(scope="module")
def engine():
    e = sim_engine()
    yield e
    e.stop()


def parked(store, name: str, hold_secs: float | None = None, **status) -> None:
    """An endpoint whose deployment is at zero replicas with scale_to_zero (what the autoscaler
    leaves); ``status`` overrides the deployment's status (a CrashLoop, a Failed one)."""
    ep = InferenceEndpoint(name=name, deployment=f"{name}-dep", status=EndpointStatus(phase="Ready"),
                           hold_secs=hold_secs)
    store.put(keyspace.endpoints(name), ep.model_dump_json())
    dep = InferenceDeployment(name=f"{name}-dep", model="m", profile="p", replicas=0,
                              autoscaling=AutoscalingSpec(min_replicas=0, scale_to_zero=True),
                              status=DeploymentStatus(**{"phase": "Ready", **status}))
    store.put(keyspace.deployments(dep.name), dep.model_dump_json())
    for kv in store.list(keyspace.replicas(f"{name}-dep")):
        store.delete(kv.key)


def chat(gw: GatewayProcess, endpoint: str, key: str) -> httpx.Response:
    return httpx.post(f"{gw.openai_base(endpoint)}/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


def test_no_replica_records_demand_and_answers_model_loading(tmp_path_factory, engine):
    """The endpoint's hold_secs 0: not held, whatever the gateway's default."""
    state, url, store = sqlite_state(tmp_path_factory, "cold")
    gw = GatewayProcess.start(state, url)
    try:
        parked(store, "cold", hold_secs=0)
        _, key = make_key(store, "cold")
        before = time.time()
        resp = chat(gw, "cold", key)
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"] == "5"
        err = resp.json()["error"]
        assert err["code"] == "model_loading" and err["type"] == "model_loading"
        assert "starts a replica" in err["message"]  # scaled to zero with scale_to_zero: this call wakes it
        demand = json.loads(store.get(keyspace.demand("cold")).value)
        assert demand["at"] >= before
        # An unknown endpoint (or an unauthenticated caller) records nothing.
        assert chat(gw, "nope", key).status_code in (401, 403, 404)
        assert store.get(keyspace.demand("nope")) is None
        # Once a replica is Ready the same call is served.
        publish_endpoint(store, "cold", [engine])
        time.sleep(1.2)  # the gateway's 1 s view cache
        assert chat(gw, "cold", key).status_code == 200
    finally:
        gw.stop()
        store.close()


def test_hold_is_on_by_default_and_the_openai_client_gets_its_answer(tmp_path_factory, engine):
    state, url, store = sqlite_state(tmp_path_factory, "hold")
    gw = GatewayProcess.start(state, url)
    try:
        parked(store, "hold")
        _, key = make_key(store, "hold")

        def autoscaler_stand_in():
            # What fabricd does when it sees the demand: a replica becomes Ready a bit later.
            wait_for(lambda: store.get(keyspace.demand("hold")) is not None,
                     15, "the held call's demand", interval=0.1)
            time.sleep(1.0)
            publish_endpoint(store, "hold", [engine])

        t = threading.Thread(target=autoscaler_stand_in)
        t.start()
        client = openai.OpenAI(base_url=gw.openai_base("hold"), api_key=key)  # the SDK as it ships
        out = client.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4)
        t.join()
        assert out.choices[0].message.content and out.choices[0].finish_reason == "length"
    finally:
        gw.stop()
        store.close()


def test_openai_client_retries_through_model_loading(tmp_path_factory, engine):
    state, url, store = sqlite_state(tmp_path_factory, "retry")
    gw = GatewayProcess.start(state, url, env={"FABRIC_GATEWAY_HOLD_SECS": "0"})
    try:
        parked(store, "retry")
        _, key = make_key(store, "retry")
        threading.Timer(2.0, publish_endpoint, args=(store, "retry", [engine])).start()
        client = openai.OpenAI(base_url=gw.openai_base("retry"), api_key=key, max_retries=5, timeout=30)
        raw = client.chat.completions.with_raw_response.create(
            model="sim-m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert raw.http_response.status_code == 200 and raw.retries_taken >= 1
        assert raw.parse().choices[0].message.content
    finally:
        gw.stop()
        store.close()


def test_nothing_coming_is_a_503_naming_the_state_without_retry_after(tmp_path_factory, engine):
    """A parked deployment (CrashLoop) is not "loading": 503 deployment_parked with the last
    failure, no Retry-After, no demand recorded, not held (the hold is for replicas coming)."""
    state, url, store = sqlite_state(tmp_path_factory, "parked")
    gw = GatewayProcess.start(state, url, env={"FABRIC_GATEWAY_HOLD_SECS": "20"})
    try:
        parked(store, "stuck", phase="CrashLoop", failures=5, last_failure="engine exited: OSError: no config.json")
        _, key = make_key(store, "stuck")
        t0 = time.monotonic()
        resp = chat(gw, "stuck", key)
        assert time.monotonic() - t0 < 15, "a refusal with nothing coming is not held"
        assert resp.status_code == 503 and "retry-after" not in resp.headers
        err = resp.json()["error"]
        assert err["code"] == "deployment_parked" and "OSError: no config.json" in err["message"]
        assert store.get(keyspace.demand("stuck")) is None
    finally:
        gw.stop()
        store.close()


def test_a_held_stream_gets_keep_alives_then_its_answer_and_the_room_is_bounded(tmp_path_factory, engine):
    """A streamed call held for a replica gets its SSE head and `: keep-alive` comments at once;
    a second held call of the same tenant past FABRIC_GATEWAY_HOLD_PER_TENANT is refused at once
    (503, Retry-After); a held call whose client leaves gives its place back; once a replica is
    Ready the held stream carries the whole answer and [DONE], and explain names the phase it
    waited in."""
    state, url, store = sqlite_state(tmp_path_factory, "keep")
    gw = GatewayProcess.start(state, url, env={"FABRIC_GATEWAY_HOLD_PER_TENANT": "1",
                                               "FABRIC_GATEWAY_HOLD_KEEPALIVE_SECS": "0.2"})
    try:
        parked(store, "keep")
        _, key = make_key(store, "keep")
        auth = {"Authorization": f"Bearer {key}"}
        body = {"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}
        base = gw.openai_base("keep")
        with httpx.Client(timeout=30) as first:
            with first.stream("POST", f"{base}/chat/completions", headers=auth, json=body) as held:
                assert held.status_code == 200 and held.headers["content-type"].startswith("text/event-stream")
                lines = held.iter_lines()
                assert next(lines) == ": keep-alive"
                refused = httpx.post(f"{base}/chat/completions", headers=auth, json=body, timeout=30)
                assert refused.status_code == 503 and refused.headers["retry-after"]
                assert "already waiting" in refused.json()["error"]["message"]
        # the first client left: its place is free again, so this call is held (not refused)
        done: dict = {}

        def call():
            with httpx.stream("POST", f"{base}/chat/completions", headers=auth, json=body, timeout=30) as r:
                done["rid"] = r.headers.get("x-fabric-request-id")
                done["lines"] = list(r.iter_lines())

        t = threading.Thread(target=call)
        t.start()
        time.sleep(1.0)
        publish_endpoint(store, "keep", [engine])
        t.join(30)
        lines = [line for line in done["lines"] if line]
        assert lines[0] == ": keep-alive" and lines[-1] == "data: [DONE]"
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in lines if line.startswith("data: {") and '"choices":[{' in line.replace(" ", ""))
        assert len(text.split()) == 5
        why = httpx.get(f"{gw.url}/api/ai/explain/request/{done['rid']}", headers=auth, timeout=10).json()
        assert why["cold_start"]["phase"] == "wake" and why["cold_start"]["held_s"] > 0
    finally:
        gw.stop()
        store.close()
