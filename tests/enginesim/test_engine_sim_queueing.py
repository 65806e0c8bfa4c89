"""Engine behaviour through real HTTP: FIFO queueing, TTFT ordering, runtime faults."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from enginesim.process import EngineProcess
from lab.rigs.polling import wait_for


@pytest.fixture(scope="module")
def slow_engine() -> Iterator[EngineProcess]:
    # One sequence at a time, 20 tokens/s: an N-token request holds the slot (N-1)/20 s.
    with EngineProcess.start(
        ["--model", "slow", "--max-num-seqs", "1", "--tokens-per-s", "20", "--prefill-tokens-per-s", "0"]
    ) as engine:
        yield engine


@dataclass
class Timed:
    sent: float = 0.0
    first_token: float = 0.0
    done: float = 0.0
    texts: list[str] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.first_token - self.sent


def stream_chat(url: str, prompt: str, max_tokens: int, out: Timed) -> None:
    body = {"model": "slow", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True}
    with httpx.Client(timeout=30) as c:
        out.sent = time.monotonic()
        with c.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                    if not out.first_token:
                        out.first_token = time.monotonic()
                    out.texts.append(line)
        out.done = time.monotonic()


def scheduler_state(url: str) -> dict:
    return httpx.get(url + "/sim/state").json()["scheduler"]


def gauge(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


def queued_total(url: str) -> int:
    state = scheduler_state(url)
    return state["running"] + state["waiting"]


def test_requests_beyond_max_num_seqs_wait_in_fifo_order(slow_engine: EngineProcess):
    url = slow_engine.url
    # The first request holds the only slot ~2 s, long enough to queue the others
    # and read the gauges even on a busy machine.
    lengths = [40, 12, 6]
    runs = [Timed() for _ in lengths]
    threads = []
    for i, (run, n) in enumerate(zip(runs, lengths, strict=True)):
        t = threading.Thread(target=stream_chat, args=(url, f"request {i}", n, run))
        t.start()
        threads.append(t)
        # Arrive one after another so FIFO order is well defined.
        wait_for(lambda i=i: queued_total(url) == i + 1, 10, f"request {i} admitted or queued", interval=0.01)
    assert gauge(url, "vllm:num_requests_waiting") == 2
    assert gauge(url, "vllm:num_requests_running") == 1
    assert gauge(url, "vllm:kv_cache_usage_perc") > 0
    for t in threads:
        t.join(30)
    assert [len(r.texts) for r in runs] == lengths
    # Queue wait is part of TTFT: each later request waited for the ones before it.
    assert runs[0].ttft < runs[1].ttft < runs[2].ttft
    assert runs[0].first_token < runs[1].first_token < runs[2].first_token
    wait_for(lambda: scheduler_state(url) == {"running": 0, "waiting": 0, "held_tokens": 0},
             10, "engine idle", interval=0.01)


def test_client_that_leaves_mid_stream_frees_its_slot(slow_engine: EngineProcess):
    url = slow_engine.url
    body = {"model": "slow", "messages": [{"role": "user", "content": "long"}], "max_tokens": 400, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions", json=body) as resp:
        lines = resp.iter_lines()  # keep a reference: dropping the iterator closes the stream
        assert next(lines).startswith("data: ")
        assert scheduler_state(url)["running"] == 1
    # The 400-token request would hold the only slot for 20 s; leaving must free it.
    wait_for(lambda: scheduler_state(url)["running"] == 0, 10, "slot released after disconnect", interval=0.01)
    quick = httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "slow", "messages": [{"role": "user", "content": "next"}], "max_tokens": 1})
    assert quick.status_code == 200


def test_faults_change_at_runtime(slow_engine: EngineProcess):
    url = slow_engine.url
    chat = {"model": "slow", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    try:
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.post(url + "/sim/faults", json={"fail_health": True}).status_code == 200
        assert httpx.get(url + "/health").status_code == 503
        httpx.post(url + "/sim/faults", json={"error_rate": 1.0}).raise_for_status()
        failed = httpx.post(url + "/v1/chat/completions", json=chat)
        assert failed.status_code == 500
        assert {"message", "type", "code"} <= failed.json()["error"].keys()
        state = httpx.get(url + "/sim/state").json()["faults"]
        assert state == {"fail_health": True, "error_rate": 1.0, "added_latency_ms": 0}
        bad = httpx.post(url + "/sim/faults", json={"error_rate": 2})
        assert bad.status_code == 422 and "error_rate" in bad.json()["error"]["message"]
    finally:
        httpx.post(url + "/sim/faults", json={"fail_health": False, "error_rate": 0.0, "added_latency_ms": 0})
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.post(url + "/v1/chat/completions", json=chat).status_code == 200


def test_added_latency_raises_ttft(slow_engine: EngineProcess):
    url = slow_engine.url
    plain, delayed = Timed(), Timed()
    stream_chat(url, "a", 1, plain)
    httpx.post(url + "/sim/faults", json={"added_latency_ms": 300}).raise_for_status()
    try:
        stream_chat(url, "a", 1, delayed)
    finally:
        httpx.post(url + "/sim/faults", json={"added_latency_ms": 0})
    assert delayed.ttft > plain.ttft
    assert delayed.ttft >= 0.3  # the injected delay is a lower bound, not a timing claim
