"""Per-runtime metric adapters (pages written the way each runtime writes them) and how the
strategies treat a reading the runtime does not report."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.engine_metrics.names import METRIC_NAMES, names_for, scrape_target
from common.engine_metrics.parse import MetricsParseError, metric_lines, parse_lines
from common.schemas import InferenceEndpoint, ReplicaObservation
from controlplane.routing.strategies import plan_routing
from tests.controlplane.planner_data import NOW, node, replica

TRITON_TRTLLM = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 40
nv_inference_request_success{model="tensorrt_llm",version="1"} 40
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="ensemble",version="1"} 2
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ensemble",version="1"} 3
nv_inference_pending_request_count{model="tensorrt_llm",version="1"} 1
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 4096
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 1024
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.25
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5
"""

LLAMA_NEW_BUILD = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""

# trtllm-serve 1.3's page (the pinned release), written from its source: fixtures/trtllm_1_3_metrics.txt.
TRTLLM = (Path(__file__).parent / "fixtures" / "trtllm_1_3_metrics.txt").read_text()


def parse(runtime: str, text: str):
    names = METRIC_NAMES[runtime]
    return parse_lines(metric_lines(text, names), names)


def test_triton_sums_models_and_reads_the_trtllm_kv_fraction_only():
    s = parse("triton", TRITON_TRTLLM)
    assert (s.waiting, s.kv_cache_usage, s.finished, s.failed) == (4, 0.25, 82, 2)
    assert sorted(s.missing) == ["running", "tokens", "ttft"]


def test_llama_cpp_without_the_kv_gauge_reports_it_missing_not_zero():
    s = parse("llama.cpp", LLAMA_NEW_BUILD)
    assert (s.waiting, s.running, s.generation_tokens) == (5, 2, 3469)
    assert "kv_cache" in s.missing


def test_the_pinned_trtllm_page_carries_every_reading_and_errors_count_as_failures():
    s = parse("tensorrt-llm", TRTLLM)
    assert (s.waiting, s.running, s.kv_cache_usage, s.finished, s.failed) == (5, 12, 0.42, 252, 3)
    assert s.generation_tokens == 40960 and s.missing == ()


def test_a_page_without_the_runtime_queue_gauge_is_an_error():
    with pytest.raises(MetricsParseError, match="te_queue_size"):
        parse("tei", TRTLLM)


def test_lacks_matches_the_docs_table():
    assert {r: METRIC_NAMES[r].lacks() for r in METRIC_NAMES} == {
        "vllm": (), "tensorrt-llm": (), "triton": ("running", "ttft", "tokens"),
        "llama.cpp": ("ttft", "failures"), "tei": ("running", "kv_cache", "ttft", "tokens"),
    }


def test_scrape_targets_follow_the_runtime_table():
    assert scrape_target("vllm", 8000) == (8000, "/metrics")
    assert scrape_target("tensorrt-llm", 8000) == (8000, "/prometheus/metrics")
    assert scrape_target("triton", 8000) == (8002, "/metrics")
    assert scrape_target("tei", 8000) == (9000, "/metrics")
    assert names_for("some-future-runtime") is METRIC_NAMES["vllm"]


NODES = {"n1": node("n1", 4), "n2": node("n2", 4)}
REPS = [replica(0, "n1", host="10.0.0.1"), replica(1, "n2", host="10.0.0.2")]


def obs(rid, *, queue, kv=0.0, missing=()):
    return ReplicaObservation(replica_id=rid, scraped_at=NOW - 1, ok=True, queue_depth=queue, kv_cache_usage=kv,
                              missing=list(missing))


@pytest.mark.parametrize("strategy", ["most_free_vram", "weighted_capacity", "energy_optimized"])
def test_kv_strategies_fall_back_to_the_queue_when_the_runtime_has_no_kv_gauge(strategy):
    ep = InferenceEndpoint(name="e", deployment="qwen", routing=strategy)
    observed = {REPS[0].replica_id: obs(REPS[0].replica_id, queue=0, missing=["kv_cache"]),
                REPS[1].replica_id: obs(REPS[1].replica_id, queue=9, missing=["kv_cache"])}
    plan = plan_routing(ep, REPS, observed, NODES, NOW)
    w = plan.weights
    # kv_cache_usage reads 0 on both: without the fallback both would get the top weight.
    assert w[REPS[0].replica_id] == 32 and w[REPS[1].replica_id] < 8


def test_explain_says_which_reading_the_runtime_lacks():
    ep = InferenceEndpoint(name="e", deployment="qwen", routing="lowest_ttft")
    observed = {r.replica_id: ReplicaObservation(replica_id=r.replica_id, scraped_at=NOW - 1, ok=True,
                                                 missing=["ttft", "tokens"]) for r in REPS}
    plan = plan_routing(ep, REPS, observed, NODES, NOW)
    assert {e.weight for e in plan.entries} == {32}
    assert all("runtime reports no ttft" in e.reason for e in plan.entries)
