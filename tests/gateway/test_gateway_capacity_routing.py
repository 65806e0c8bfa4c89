"""Spillover, priority bands with displacement, external providers and fallbacks through real
processes: one gateway, three fabric-engine-sim replicas in two pools (cap-main, then cap-spill),
and an OpenAI-compatible provider stand-in on loopback with two keys. Saturation comes from the
replicas' observations in the store (what the routing controller's scrape writes)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from common import keyspace
from common.schemas import ExternalProvider, InferenceEndpoint, ProviderKey, ReplicaObservation
from lab.rigs.polling import wait_for
from lab.rigs.routing_plans import publish_plans
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state

MAIN, SPILL = ["cap-main-0", "cap-main-1"], ["cap-spill-0"]
CHAT = {"model": "sim-m", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}


class Provider:
    """A provider stand-in: answers per bearer key (key-a and key-b configurable, else 200)."""

    def __init__(self):
        self.answers = {"key-a": 429, "key-b": 401}
        self.reply_headers: dict[str, str] = {}  # sent with every answer
        self.seen: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                key = self.headers.get("authorization", "").removeprefix("Bearer ")
                outer.seen.append({"key": key, "path": self.path, "model": body.get("model"),
                                   "headers": dict(self.headers)})
                status = outer.answers.get(key, 200)
                out = {"id": "x", "object": "chat.completion", "model": body.get("model"),
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "from provider"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
                if status != 200:
                    out = {"error": {"message": "provider says no", "type": "x", "code": str(status)}}
                raw = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                if status == 429:
                    self.send_header("retry-after", "1")
                for name, value in outer.reply_headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "capacity")
    engines = {rid: sim_engine("--replica-id", rid) for rid in MAIN + SPILL}
    provider = Provider()
    keys = tmp_path_factory.mktemp("provider-keys")
    (keys / "key-a").write_text("key-a\n")
    (keys / "key-b").write_text("key-b\n")
    outside = tmp_path_factory.mktemp("elsewhere") / "secret"
    outside.write_text("not-a-provider-key\n")
    (keys / "escape").symlink_to(outside)
    try:
        publish_endpoint(store, "cap", [engines[r] for r in MAIN], deployment="cap-main")
        publish_endpoint(store, "capspill", [engines[r] for r in SPILL], deployment="cap-spill")
        ep = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints("cap")).value)
        store.put(keyspace.endpoints("cap"), ep.model_copy(update={"spillover": ["cap-spill"],
                                                                   "fallbacks": ["ext"]}).model_dump_json())
        ext = InferenceEndpoint(name="ext", deployment="ext", external=ExternalProvider(
            url=provider.url, model="provider-model",
            keys=[ProviderKey(file=str(keys / "key-a")), ProviderKey(file=str(keys / "key-b")),
                  ProviderKey(file=str(outside)), ProviderKey(file=str(keys / "escape"))]))
        store.put(keyspace.endpoints("ext"), ext.model_dump_json())
        publish_plans(store)  # cap's plan with its spillover pool, as the routing tick publishes it
        gw = GatewayProcess.start(state, url, env={
            "FABRIC_SATURATION_QUEUE": "2", "FABRIC_GATEWAY_CACHE_SECS": "0.1", "FABRIC_BAND_QUEUE": "2",
            "FABRIC_BAND_TOTAL": "2", "FABRIC_BAND_TTL_SECS": "5", "FABRIC_PROVIDER_KEY_DIR": str(keys)})
        try:
            yield store, gw, provider, keys
        finally:
            gw.stop()
    finally:
        provider.server.shutdown()
        for e in engines.values():
            e.stop()
        store.close()


def load(store, **queues: float) -> None:
    """Write each replica's observation (queue depth), as the routing controller's scrape does."""
    for rid in MAIN + SPILL:
        obs = ReplicaObservation(replica_id=rid, scraped_at=time.time(), ok=True,
                                 queue_depth=queues.get(rid.replace("-", "_"), 0))
        store.put(keyspace.observations(rid), obs.model_dump_json())
    time.sleep(0.3)  # past the gateway's view cache


def call(gw, key: str, endpoint: str = "cap", priority: str | None = None, timeout: float = 20) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"}
    if priority:
        headers["x-request-priority"] = priority
    return httpx.post(gw.openai_base(endpoint) + "/chat/completions", headers=headers, json=CHAT, timeout=timeout)


def explain(gw, key: str, r: httpx.Response) -> dict:
    rid = r.headers["x-fabric-request-id"]
    return httpx.get(f"{gw.url}/api/ai/explain/request/{rid}", headers={"authorization": f"Bearer {key}"}).json()


def metric(gw, name: str) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def waiting(gw, band: str, n: int) -> None:
    """Until the gateway reports n calls waiting in the band (its fabric_gateway_waiting gauge)."""
    wait_for(lambda: metric(gw, f'fabric_gateway_waiting{{band="{band}",endpoint="cap"}}') == n, 20,
             f"{n} waiting in {band}", interval=0.05)


SATURATED_MAIN = {"cap_main_0": 5, "cap_main_1": 5}
SATURATED_ALL = {**SATURATED_MAIN, "cap_spill_0": 5}


def test_spillover_to_the_next_pool_and_back(stack):
    store, gw, _, _ = stack
    _, key = make_key(store, "cap")
    load(store, cap_main_0=5)  # one main replica has room: no spill
    assert call(gw, key).headers["x-fabric-replica"] in MAIN
    load(store, **SATURATED_MAIN)
    r = call(gw, key)
    assert r.status_code == 200 and r.headers["x-fabric-replica"] == "cap-spill-0"
    why = explain(gw, key, r)
    assert why["spilled_to"] == "cap-spill" and [p["saturated"] for p in why["pools"]] == [True, False]
    load(store)
    assert call(gw, key).headers["x-fabric-replica"] in MAIN


def test_a_higher_band_displaces_the_newest_lower_call(stack):
    store, gw, _, _ = stack
    _, key = make_key(store, "cap", priority="low")  # the key's default band
    _, high_key = make_key(store, "cap", priority="high")  # a band above a key's own needs a key allowed it
    load(store, **SATURATED_ALL)
    displaced_before = metric(gw, 'fabric_gateway_displaced_total{endpoint="cap"}')
    results: dict[str, httpx.Response] = {}

    def run(name, priority=None):
        results[name] = call(gw, high_key if priority == "high" else key, priority=priority)

    first = threading.Thread(target=run, args=("low-1",))
    first.start()
    waiting(gw, "low", 1)
    second = threading.Thread(target=run, args=("low-2",))
    second.start()
    waiting(gw, "low", 2)  # both low calls wait: the total (2) is reached
    high = threading.Thread(target=run, args=("high", "high"))
    high.start()
    second.join(10)
    r = results["low-2"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "displaced" and r.headers["retry-after"]
    assert explain(gw, key, r)["displaced"] is True
    assert metric(gw, 'fabric_gateway_displaced_total{endpoint="cap"}') == displaced_before + 1
    load(store)  # room again: the waiting calls go, the high one first
    first.join(10)
    high.join(10)
    assert results["low-1"].status_code == 200 and results["high"].status_code == 200
    why = explain(gw, high_key, results["high"])
    assert why["band"] == "high" and why["queued_s"] > 0 and explain(gw, key, results["low-1"])["band"] == "low"


def test_provider_keys_breakers_refusal_and_rotation(stack):
    store, gw, provider, keys = stack
    _, key = make_key(store, "ext")
    r = call(gw, key, endpoint="ext")  # key-a answers 429, key-b 401: no key left
    assert r.status_code == 503 and r.json()["error"]["code"] == "provider_unavailable"
    why = explain(gw, key, r)
    # Callers learn keys by index only: neither the answer nor explain names a key file.
    assert "key-a" not in r.text + str(why) and "key-b" not in r.text + str(why)
    assert why["keys_refused"] == ["#1"] and why["keys_failed"] == ["#0"]
    assert metric(gw, 'fabric_gateway_provider_key_state{endpoint="ext",key="0"}') == 2  # open
    assert metric(gw, 'fabric_gateway_provider_key_state{endpoint="ext",key="1"}') == 3  # refused
    assert "key-b" in gw.log_text() and "Bearer" not in gw.log_text()
    # Files outside FABRIC_PROVIDER_KEY_DIR (directly or through a symlink) are never read.
    assert [k["state"] for k in why["keys"][2:]] == ["unreadable", "unreadable"]
    assert not any(s["key"] == "not-a-provider-key" for s in provider.seen)
    provider.answers["key-a"] = 200
    time.sleep(1.1)  # key-a's Retry-After: its breaker lets one trial through
    r = call(gw, key, endpoint="ext")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "from provider"
    last = provider.seen[-1]
    assert last["key"] == "key-a" and last["model"] == "provider-model" and last["path"] == "/v1/chat/completions"
    assert not any("fvai_" in v for s in provider.seen for v in s["headers"].values())
    assert metric(gw, 'fabric_gateway_provider_key_state{endpoint="ext",key="0"}') == 0
    # Rotation: key-b's file gets a key the provider accepts; key-a starts failing.
    provider.answers["key-a"] = 500
    (keys / "key-b").write_text("key-c\n")
    time.sleep(1.1)  # files are stat'ed at most once a second
    r = call(gw, key, endpoint="ext")
    assert r.status_code == 200 and provider.seen[-1]["key"] == "key-c"
    assert explain(gw, key, r)["key"] == "#1"


def test_fallback_only_when_the_cluster_is_full_and_only_for_keys_that_allow_it(stack):
    store, gw, provider, _ = stack
    provider.answers.update({"key-a": 200})
    _, leaving = make_key(store, "cap", fallbacks=("ext",))
    _, staying = make_key(store, "cap")
    load(store, **SATURATED_MAIN)  # the spill pool has room: no fallback
    assert call(gw, leaving).headers["x-fabric-replica"] == "cap-spill-0"
    load(store, **SATURATED_ALL)
    seen = len(provider.seen)
    r = call(gw, leaving)
    assert r.status_code == 200 and len(provider.seen) == seen + 1
    assert explain(gw, leaving, r)["fallback"] == "ext"
    r = call(gw, staying)  # may not leave: waits in its band, then times out
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_timeout" and len(provider.seen) == seen + 1
    why = explain(gw, staying, r)
    assert why["refused"] == "queue_timeout" and why["band"] == "normal" and why["fallbacks_not_allowed"] == ["ext"]
    assert [p["saturated"] for p in why["pools"]] == [True, True]
    load(store)
