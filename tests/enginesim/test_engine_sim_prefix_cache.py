"""The simulator's prefix cache: chained block hashes, LRU bound, hits shortening prefill, and
vLLM's vllm:prefix_cache_queries / vllm:prefix_cache_hits counters over real HTTP."""

from __future__ import annotations

import httpx

from enginesim.engine import Engine
from enginesim.generation_plan import plan_generation
from enginesim.prefix_cache import PrefixCache
from enginesim.process import EngineProcess
from enginesim.settings import EngineSettings

SYSTEM = "You are a careful assistant. " * 20  # 580 chars: 9 full 64-char blocks


def test_only_a_whole_leading_prefix_hits_and_the_cache_is_bounded():
    cache = PrefixCache(capacity_blocks=12)
    assert cache.lookup_and_insert(SYSTEM + "question one", 150) == 0
    assert cache.lookup_and_insert(SYSTEM + "question two", 150) == 9 * 16
    assert cache.lookup_and_insert("x" + SYSTEM, 150) == 0  # same text shifted: no block matches
    assert len(cache) == 12  # bounded; the oldest blocks went first
    assert cache.lookup_and_insert(SYSTEM, 150) < 9 * 16
    assert PrefixCache(capacity_blocks=0).lookup_and_insert(SYSTEM, 150) == 0


def test_a_hit_prefills_only_the_missed_tokens():
    engine = Engine(EngineSettings(model="m", prefill_tokens_per_s=1000, prefix_cache_blocks=64))
    cold = engine.with_prefix_cache(plan_generation(engine.settings, SYSTEM + "a", 4), SYSTEM + "a")
    warm = engine.with_prefix_cache(plan_generation(engine.settings, SYSTEM + "b", 4), SYSTEM + "b")
    assert cold.prefill_s == cold.prompt_tokens / 1000
    assert warm.prefill_s == (warm.prompt_tokens - 9 * 16) / 1000 < cold.prefill_s


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


def test_metrics_count_queried_and_hit_tokens_over_http():
    with EngineProcess.start(["--model", "sim-m", "--tokens-per-s", "0", "--prefill-tokens-per-s", "0",
                              "--prefix-cache-blocks", "64"]) as eng:
        prompt_tokens = 0
        for q in ("first question", "second question"):
            r = httpx.post(eng.url + "/v1/chat/completions", timeout=10, json={
                "model": "sim-m", "max_tokens": 2,
                "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]})
            assert r.status_code == 200
            prompt_tokens += r.json()["usage"]["prompt_tokens"]
        text = httpx.get(eng.url + "/metrics", timeout=5).text
        queried = _counter(text, "vllm:prefix_cache_queries_total")
        hits = _counter(text, "vllm:prefix_cache_hits_total")
        assert queried == prompt_tokens
        assert hits >= 9 * 16 and hits < queried
