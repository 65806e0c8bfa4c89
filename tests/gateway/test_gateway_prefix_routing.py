"""routing_l7: prefix through real processes: a gateway in front of three fabric-engine-sim
replicas with prefix caches. Calls sharing a system prompt stay on the replicas whose caches hold
it, spreading over idle ones one call at a time (the engines' own vllm:prefix_cache_* counters
say what hit), and
GET /api/ai/explain/request/{id} says which scores chose the replica, to its caller only."""

from __future__ import annotations

import httpx
import openai
import pytest

from common import keyspace
from common.schemas import InferenceEndpoint
from enginesim.process import EngineProcess
from tests.gateway.gateway_harness import gateway_over, make_key, publish_endpoint, sqlite_state

SYSTEMS = [f"You are assistant number {i}. Follow the house style guide in every answer. " * 6 for i in range(2)]


def _counter(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "prefix")
    argv = ["--model", "sim-m", "--tokens-per-s", "0", "--prefill-tokens-per-s", "0", "--prefix-cache-blocks", "256"]
    engines = [EngineProcess.start(argv) for _ in range(3)]
    publish_endpoint(store, "pfx", engines)
    ep = InferenceEndpoint.model_validate_json(store.get(keyspace.endpoints("pfx")).value)
    store.put(keyspace.endpoints("pfx"), ep.model_copy(update={"routing_l7": "prefix"}).model_dump_json())
    with gateway_over(state, url, store, engines) as gw:
        yield store, gw, engines


def test_shared_system_prompts_stay_on_the_replicas_that_cache_them_and_spread_while_idle(stack):
    store, gw, engines = stack
    _, key = make_key(store, "pfx", name="pfx-k")
    c = openai.OpenAI(base_url=gw.openai_base("pfx"), api_key=key, max_retries=0)
    chosen: dict[int, list[str]] = {0: [], 1: []}
    for turn in range(6):
        for s, system in enumerate(SYSTEMS):
            raw = c.chat.completions.with_raw_response.create(
                model="sim-m", max_tokens=2,
                messages=[{"role": "system", "content": system}, {"role": "user", "content": f"question {turn}"}])
            rid = raw.headers["x-fabric-request-id"]
            why = httpx.get(f"{gw.url}/api/ai/explain/request/{rid}", headers={"authorization": f"Bearer {key}"}).json()
            assert why["mode"] == "prefix" and why["endpoint"] == "pfx"
            assert {row["replica"] for row in why["scores"]} == {"pfx-dep-0", "pfx-dep-1", "pfx-dep-2"}
            rows = {row["replica"]: row for row in why["scores"]}
            if turn:  # kept where the prompt is cached, or (one call at a time: every replica idle)
                # moved to a quieter idle replica for at most tau more prefill
                assert why["reason"] in ("sticky", "spread"), why
                if why["reason"] == "sticky":
                    assert rows[why["chosen"]]["matched_tokens"] > 0
                else:
                    assert rows[why["chosen"]]["cost_tokens"] - rows[why["sticky"]]["cost_tokens"] <= why["tau_tokens"]
            chosen[s].append(why["chosen"])
    calls = chosen[0] + chosen[1]
    assert 3 * max(calls.count(r) for r in set(calls)) / len(calls) <= 1.5  # hotspot index over 12 calls
    queried = sum(_counter(e.url, "vllm:prefix_cache_queries_total") for e in engines)
    hits = sum(_counter(e.url, "vllm:prefix_cache_hits_total") for e in engines)
    assert queried > 0 and hits / queried > 0.5


def test_explanations_are_for_their_caller_only(stack):
    store, gw, _ = stack
    _, key = make_key(store, "pfx", name="pfx-owner")
    _, other = make_key(store, "pfx", name="pfx-other")
    r = httpx.post(gw.openai_base("pfx") + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                   json={"model": "sim-m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    rid = r.headers["x-fabric-request-id"]
    url = f"{gw.url}/api/ai/explain/request/{rid}"
    assert httpx.get(url, headers={"authorization": f"Bearer {key}"}).status_code == 200
    unknown = httpx.get(url[:-4] + "0000", headers={"authorization": f"Bearer {key}"})
    foreign = httpx.get(url, headers={"authorization": f"Bearer {other}"})
    assert unknown.status_code == foreign.status_code == 404 and unknown.json() == foreign.json()
    assert httpx.get(url).status_code == 401
