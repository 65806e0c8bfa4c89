"""vLLM-named Prometheus metrics on a per-app registry.

Names, labels and histogram buckets follow vLLM's (held to vLLM 0.32's own page by
tests/enginesim/test_conformance_real.py: every series carries ``engine="0"`` and
``model_name``; request_success has all five finished reasons), so routing code that scrapes a
real vLLM scrapes this the same way. Gauges are read
live from the scheduler at scrape time (plus any synthetic load), never cached.
`legacy_names` emits `vllm:gpu_cache_usage_perc` (vLLM before 0.7) instead of
`vllm:kv_cache_usage_perc`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from enginesim.runtime_metrics import FAILED, render_as

# vLLM's buckets, copied so dashboards built for vLLM line up.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
KV_USAGE = "vllm:kv_cache_usage_perc"
ENGINE = "0"  # vLLM labels each series with its engine index (one engine per server here)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"


@dataclass(frozen=True)
class LiveLoad:
    running: int
    waiting: int
    kv_usage: float  # 0..1


class _LoadCollector(Collector):
    def __init__(self, model: str, read_load: Callable[[], LiveLoad], legacy_names: bool):
        self._model = model
        self._read = read_load
        self._kv_name = KV_USAGE_LEGACY if legacy_names else KV_USAGE

    def collect(self) -> Iterable[GaugeMetricFamily]:
        load = self._read()
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests currently running on GPU.", load.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", load.waiting),
            (self._kv_name, "KV-cache usage. 1 means 100 percent usage.", load.kv_usage),
        ):
            family = GaugeMetricFamily(name, doc, labels=["engine", "model_name"])
            family.add_metric([ENGINE, self._model], value)
            yield family


class EngineMetrics:
    def __init__(self, model: str, read_load: Callable[[], LiveLoad], legacy_names: bool = False):
        self.registry = CollectorRegistry(auto_describe=False)
        self._model = model
        labels = ["engine", "model_name"]
        self.registry.register(_LoadCollector(model, read_load, legacy_names))
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            labels, buckets=TTFT_BUCKETS, registry=self.registry,
        ).labels(ENGINE, model)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
            labels, buckets=E2E_BUCKETS, registry=self.registry,
        ).labels(ENGINE, model)
        self._prompt = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=self.registry
        ).labels(ENGINE, model)
        self._generation = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=self.registry
        ).labels(ENGINE, model)
        self._cache_queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            labels, registry=self.registry,
        ).labels(ENGINE, model)
        self._cache_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            labels, registry=self.registry,
        ).labels(ENGINE, model)
        self._success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            ["engine", "finished_reason", "model_name"], registry=self.registry,
        )
        # Injected faults, in a registry of their own: only runtimes with an error counter show
        # them (runtime_metrics), so the vLLM page stays as vLLM writes it.
        self.failures_registry = CollectorRegistry(auto_describe=False)
        self._failed = Counter(FAILED, "Requests the simulator failed on purpose.", registry=self.failures_registry)
        # Pre-create every reason vLLM does, so a scraper sees zeros rather than absent series.
        for reason in FINISHED_REASONS:
            self._success.labels(ENGINE, reason, model)

    def observe_failed(self) -> None:
        """A request failed on purpose: the runtime's error counter, and on the vLLM page an
        aborted request (finished_reason "abort", as vLLM counts one), which fabricd's rollout
        windows read as a failure. The other runtimes' pages leave "abort" out of success."""
        self._failed.inc()
        self._success.labels(ENGINE, "abort", self._model).inc()

    def observe_first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self._ttft.observe(ttft_s)
        self._prompt.inc(prompt_tokens)

    def observe_prefix_cache(self, queried: int, hit: int) -> None:
        self._cache_queries.inc(queried)
        self._cache_hits.inc(hit)

    def observe_tokens(self, count: int) -> None:
        if count:
            self._generation.inc(count)

    def observe_finished(self, e2e_s: float, finish_reason: str) -> None:
        self._e2e.observe(e2e_s)
        self._success.labels(ENGINE, finish_reason, self._model).inc()

    def render(self, runtime: str = "vllm") -> bytes:
        if runtime == "vllm":
            return generate_latest(self.registry)
        return render_as(runtime, [self.registry, self.failures_registry])
