"""Each runtime's Prometheus metric names for the readings routing uses, and where to scrape.

Names come from each project's own source and docs:
  vLLM           vllm:num_requests_waiting/running, vllm:kv_cache_usage_perc (or the older
                 vllm:gpu_cache_usage_perc), vllm:time_to_first_token_seconds,
                 vllm:generation_tokens_total, vllm:request_success_total{finished_reason}
  TensorRT-LLM   trtllm-serve's /prometheus/metrics: trtllm_num_requests_waiting/running,
                 trtllm_kv_cache_utilization, trtllm_time_to_first_token_seconds,
                 trtllm_generation_tokens_total, trtllm_request_success_total,
                 trtllm_request_error_total
  Triton         :8002/metrics: nv_inference_pending_request_count (queue),
                 nv_inference_request_success / nv_inference_request_failure, and with the
                 TensorRT-LLM backend nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}
  llama.cpp      llama-server --metrics: llamacpp:requests_deferred (queue),
                 llamacpp:requests_processing, llamacpp:kv_cache_usage_ratio (older builds),
                 llamacpp:tokens_predicted_total
  TEI            :9000/metrics: te_queue_size, te_request_success / te_request_failure

What a runtime lacks (MetricNames.lacks) and how each strategy treats the gap is written in
docs/runtimes.md; strategies.py implements it.
"""

from __future__ import annotations

from common.engine_metrics.parse import VLLM_NAMES, MetricNames
from common.runtimes import RUNTIME_TABLE, Runtime

METRIC_NAMES: dict[str, MetricNames] = {
    "vllm": VLLM_NAMES,
    "tensorrt-llm": MetricNames(
        "tensorrt-llm", waiting=("trtllm_num_requests_waiting",), running=("trtllm_num_requests_running",),
        kv_usage=("trtllm_kv_cache_utilization",), ttft="trtllm_time_to_first_token_seconds",
        tokens=("trtllm_generation_tokens_total",), finished=("trtllm_request_success_total",),
        failures=("trtllm_request_error_total",)),
    "triton": MetricNames(
        "triton", waiting=("nv_inference_pending_request_count",),
        kv_usage=("nv_trt_llm_kv_cache_block_metrics",), kv_label=("kv_cache_block_type", "fraction"),
        finished=("nv_inference_request_success",), failures=("nv_inference_request_failure",)),
    "llama.cpp": MetricNames(
        "llama.cpp", waiting=("llamacpp:requests_deferred",), running=("llamacpp:requests_processing",),
        kv_usage=("llamacpp:kv_cache_usage_ratio",), tokens=("llamacpp:tokens_predicted_total",)),
    "tei": MetricNames(
        "tei", waiting=("te_queue_size",), finished=("te_request_success",), failures=("te_request_failure",)),
}


def names_for(runtime: str) -> MetricNames:
    """The runtime's names; an unknown runtime (a record from a newer fabricd) reads as vLLM."""
    return METRIC_NAMES.get(runtime, VLLM_NAMES)


def scrape_target(runtime: str, api_port: int) -> tuple[int, str]:
    """(port, path) of the runtime's /metrics for a replica serving on ``api_port``."""
    rt: Runtime = RUNTIME_TABLE.get(runtime, RUNTIME_TABLE["vllm"])
    return rt.scrape_port(api_port), rt.metrics_path
