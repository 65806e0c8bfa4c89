"""The simulator's /metrics page under another runtime's metric names (`--runtime NAME`).

The engine always records vLLM-named metrics (metrics.py); for another runtime this module
renders the same readings under that runtime's own names, and leaves out what the runtime
does not report, so fabricd's metric adapters meet the page a real engine would serve:

  tensorrt-llm  trtllm_num_requests_waiting/running, trtllm_kv_cache_utilization,
                trtllm_time_to_first_token_seconds, trtllm_generation_tokens_total,
                trtllm_request_success_total, trtllm_request_error_total
  triton        nv_inference_pending_request_count, nv_inference_request_success,
                nv_inference_request_failure (labels model, version)
  llama.cpp     llamacpp:requests_deferred, llamacpp:requests_processing,
                llamacpp:kv_cache_usage_ratio, llamacpp:tokens_predicted_total
  tei           te_queue_size, te_request_success, te_request_failure

Failed requests (injected faults) are counted in a separate counter that only runtimes with
an error metric show; the vLLM page is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

FAILED = "sim:request_failed"
NO_TOTAL_SUFFIX = ("triton", "tei")  # their exporters write counters without _total  # the simulator's own counter of injected faults

# runtime -> {vLLM family (or FAILED): the runtime's family}
RENAMES: dict[str, dict[str, str]] = {
    "tensorrt-llm": {
        "vllm:num_requests_waiting": "trtllm_num_requests_waiting",
        "vllm:num_requests_running": "trtllm_num_requests_running",
        "vllm:kv_cache_usage_perc": "trtllm_kv_cache_utilization",
        "vllm:time_to_first_token_seconds": "trtllm_time_to_first_token_seconds",
        "vllm:generation_tokens": "trtllm_generation_tokens",
        "vllm:request_success": "trtllm_request_success",
        FAILED: "trtllm_request_error",
    },
    "triton": {
        "vllm:num_requests_waiting": "nv_inference_pending_request_count",
        "vllm:request_success": "nv_inference_request_success",
        FAILED: "nv_inference_request_failure",
    },
    "llama.cpp": {
        "vllm:num_requests_waiting": "llamacpp:requests_deferred",
        "vllm:num_requests_running": "llamacpp:requests_processing",
        "vllm:kv_cache_usage_perc": "llamacpp:kv_cache_usage_ratio",
        "vllm:generation_tokens": "llamacpp:tokens_predicted",
    },
    "tei": {
        "vllm:num_requests_waiting": "te_queue_size",
        "vllm:request_success": "te_request_success",
        FAILED: "te_request_failure",
    },
}


def _labels(runtime: str, labels: dict[str, str]) -> dict[str, str]:
    labels = {k: v for k, v in labels.items() if k != "engine"}  # vLLM's engine index: its page only
    if runtime == "triton" and "model_name" in labels:
        # Triton labels per model and version; the finish reason is not one of its labels.
        return {"model": labels["model_name"], "version": "1"}
    if runtime in ("llama.cpp", "tei"):
        return {}  # one model per process, no labels
    return dict(labels)


class _Renamed(Collector):
    def __init__(self, runtime: str, sources: list[CollectorRegistry]):
        self.runtime = runtime
        self.sources = sources
        self.renames = RENAMES[runtime]

    def collect(self) -> Iterable[Metric]:
        for source in self.sources:
            for family in source.collect():
                new = self.renames.get(family.name)
                if new is None:
                    continue
                out = Metric(new, family.documentation, family.type)
                merged: dict[tuple[str, tuple], float] = {}
                for sample in family.samples:
                    if sample.name.endswith("_created") or sample.labels.get("finished_reason") == "abort":
                        continue  # an aborted request is the runtime's failure counter (FAILED), not a success
                    name = new + sample.name[len(family.name):]
                    if self.runtime in NO_TOTAL_SUFFIX:
                        name = name.removesuffix("_total")
                    key = (name, tuple(sorted(_labels(self.runtime, sample.labels).items())))
                    merged[key] = merged.get(key, 0.0) + sample.value  # labels dropped: series add up
                for (name, labels), value in merged.items():
                    out.add_sample(name, dict(labels), value)
                yield out


def render_as(runtime: str, sources: list[CollectorRegistry]) -> bytes:
    """The page ``runtime`` would serve for the readings held in ``sources``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Renamed(runtime, sources))
    return generate_latest(registry)
