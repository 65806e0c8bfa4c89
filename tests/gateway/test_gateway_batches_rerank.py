"""Batches (Files API, multipart upload, GET polling) and rerank through a real fabric-gateway in
front of a real fabric-engine-sim, with a real API key: the official openai client unchanged."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "gw")
    engine = sim_engine("--embedding-dim", "8")
    publish_endpoint(store, "batchy", [engine])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    _, key = make_key(store, "batchy")
    yield {"store": store, "gw": gw, "engine": engine, "key": key}
    gw.stop()
    engine.stop()
    store.close()


def test_batch_through_the_gateway_with_the_openai_client(env):
    c = openai.OpenAI(base_url=env["gw"].openai_base("batchy"), api_key=env["key"], max_retries=0, timeout=10)
    rows = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "sim-m", "messages": [{"role": "user", "content": f"batch question {i}"}],
                      "max_tokens": 3}} for i in range(6)]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    f = c.files.create(file=("batch.jsonl", data), purpose="batch")
    assert f.bytes == len(data) and f.purpose == "batch"
    assert c.files.retrieve(f.id).filename == "batch.jsonl"
    batch = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_for(lambda: b if (b := c.batches.retrieve(batch.id)).status in ("completed", "failed", "cancelled")
                     else None, 15, f"batch {batch.id} to end", interval=0.05)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 6, 0)
    assert batch.id in [b.id for b in c.batches.list()]
    out = [json.loads(line) for line in c.files.content(batch.output_file_id).text.splitlines() if line]
    assert sorted(r["custom_id"] for r in out) == sorted(r["custom_id"] for r in rows)
    for r in out:
        assert r["error"] is None and r["response"]["status_code"] == 200
        assert r["response"]["body"]["usage"]["completion_tokens"] == 3
    # The key is what let the client in: without it the same route is refused at the gateway.
    anonymous = httpx.get(env["gw"].openai_base("batchy") + f"/batches/{batch.id}")
    assert anonymous.status_code == 401


def test_rerank_through_the_gateway_scores_every_document(env):
    docs = ["the cat sat on the mat", "GPUs run inference", "a gateway checks API keys"]
    r = httpx.post(env["gw"].openai_base("batchy") + "/rerank", timeout=10,
                   headers={"authorization": f"Bearer {env['key']}"},
                   json={"model": "sim-m", "query": "which one is about API keys?", "documents": docs})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert sorted(x["index"] for x in results) == [0, 1, 2]
    assert all(isinstance(x["relevance_score"], float) for x in results)
    assert [x["document"]["text"] for x in sorted(results, key=lambda x: x["index"])] == docs
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert httpx.post(env["gw"].openai_base("batchy") + "/rerank",
                      json={"model": "sim-m", "query": "q", "documents": ["d"]}).status_code == 401
