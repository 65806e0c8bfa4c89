"""The routing parser on a /metrics page captured from the real engine: vLLM 0.32's CPU build
(.venv-engine) serving the lab's tiny model with --max-num-seqs 2 under 6 concurrent requests
(fixtures/vllm_0_32_cpu_metrics.txt, our own captured output; recapture the same way after an
engine upgrade: tests/enginesim/test_conformance_real.py checks the live page's families)."""

from pathlib import Path

import pytest

from common.engine_metrics.parse import (
    SeriesCache,
    observe,
    parse_vllm_lines,
    parse_vllm_metrics,
    vllm_lines,
)

PAGE = (Path(__file__).parent / "fixtures" / "vllm_0_32_cpu_metrics.txt").read_text()


def test_the_real_page_reads_queue_running_and_kv():
    sample = parse_vllm_metrics(PAGE)
    assert (sample.waiting, sample.running) == (4, 2)  # the engine's own queue, not a simulation
    assert sample.kv_cache_usage == pytest.approx(0.0034196384953590897)
    assert sample.generation_tokens == 422 and sample.ttft_count == 2 and sample.missing == ()


def test_fast_path_and_series_cache_read_what_the_full_parse_reads():
    kept = vllm_lines(PAGE)
    assert len(kept.splitlines()) < len(PAGE.splitlines()) / 2  # most of a real page is not read
    assert parse_vllm_lines(kept) == parse_vllm_metrics(PAGE)
    cache = SeriesCache()
    assert parse_vllm_metrics(PAGE, cache) == parse_vllm_metrics(PAGE, cache) == parse_vllm_metrics(PAGE)


def test_engine_label_is_summed_over_engine_cores():
    first = parse_vllm_metrics(PAGE)
    twice = parse_vllm_metrics(PAGE.replace('engine="0"', 'engine="1"') + PAGE)  # two engine cores, one server
    assert twice.waiting == 2 * first.waiting and twice.generation_tokens == 2 * first.generation_tokens
    obs = observe("r", twice, first, 10.0, 1000.0)  # the later scrape first
    assert obs.queue_depth == 8 and obs.tokens_per_s == pytest.approx(first.generation_tokens / 10.0)
