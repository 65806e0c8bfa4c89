"""Prometheus metrics for the gateway, in a registry owned by the app (never a module global).

Labels come only from the catalogue: the endpoint name once it has resolved in the store, the
model when it is a registered model (else "unknown"), and a fixed set of outcomes -- so a caller
cannot blow up label cardinality, and no key, tenant secret or prompt is ever a label.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from common import runtime_metrics
from common.records import reading
from gateway.metric_tally import Tally

OUTCOMES = ("success", "upstream_error", "upstream_cut", "budget_cut", "client_closed", "refused", "unauthorized", "rate_limited", "error")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    tokens: Counter
    ttft: Histogram
    latency: Histogram
    in_flight: Gauge
    displaced: Counter
    waiting: Gauge
    spilled: Counter
    fallbacks: Counter
    provider_keys: Gauge
    audit_dropped: Counter
    runtime: runtime_metrics.RuntimeCollector
    usage_missing: Counter | None = None  # generating calls whose answer had no usage (gateway.usage_inject)
    shadow_refusals: Counter | None = None  # calls a shadowed limit would have refused (gateway.shadow)
    usage_dropped: Counter | None = None  # usage records the ledger could not keep (gateway.usage_ledger)
    store_up: Gauge | None = None  # 1 when the store answered the probe of the last scrape (gateway.readiness)
    readings_age: Gauge | None = None  # seconds since the streamed readings were confirmed (UpstreamCache)
    # cut streams by what became of them: moved, ended (whole already), not_moved (gateway.stream_migration)
    migrations: Counter | None = None
    _children: dict = field(default_factory=dict)  # (metric, labels) -> child: labels() costs a lock and a tuple
    _tally: Tally = field(default_factory=Tally)  # the per-call metrics' pending updates (gateway.metric_tally)
    # Several workers (PROMETHEUS_MULTIPROC_DIR): another worker answering a scrape reads this
    # one's values from its files, so per-call updates go straight to the children.
    _direct: bool = False

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None, *, multiprocess: bool = False) -> GatewayMetrics:
        """multiprocess: GatewaySettings.metrics_multiprocess (PROMETHEUS_MULTIPROC_DIR, `--workers N`)."""
        reg = registry or CollectorRegistry()
        reading.install(reg)  # records a store listing skipped (fabric_records_unreadable_total{kind})
        return cls(
            _direct=multiprocess,
            registry=reg,
            requests=Counter("fabric_gateway_requests", "Gateway calls by endpoint and outcome",
                             ["endpoint", "outcome"], registry=reg),
            tokens=Counter("fabric_gateway_tokens", "Tokens counted from upstream usage",
                           ["endpoint", "model"], registry=reg),
            ttft=Histogram("fabric_gateway_ttft_seconds", "Time to the first upstream byte",
                           ["endpoint"], buckets=LATENCY_BUCKETS, registry=reg),
            latency=Histogram("fabric_gateway_latency_seconds", "Whole-call latency",
                              ["endpoint", "outcome"], buckets=LATENCY_BUCKETS, registry=reg),
            # livesum: with several worker processes (multiprocess mode) the live workers' sum.
            in_flight=Gauge("fabric_gateway_in_flight", "Calls being proxied now", ["endpoint"], registry=reg,
                            multiprocess_mode="livesum"),
            displaced=Counter("fabric_gateway_displaced", "Waiting calls displaced by a higher band",
                              ["endpoint"], registry=reg),
            waiting=Gauge("fabric_gateway_waiting", "Calls waiting in their priority band", ["endpoint", "band"],
                          registry=reg, multiprocess_mode="livesum"),
            spilled=Counter("fabric_gateway_spilled", "Calls sent to a spillover pool", ["endpoint"], registry=reg),
            fallbacks=Counter("fabric_gateway_fallbacks", "Calls sent to an external fallback", ["endpoint"],
                              registry=reg),
            # 0 closed, 1 half_open, 2 open, 3 refused (401); key is the key's index, never its text
            provider_keys=Gauge("fabric_gateway_provider_key_state", "Breaker state of each external provider key",
                                ["endpoint", "key"], registry=reg, multiprocess_mode="mostrecent"),
            # audit rows the writer could not keep: its queue was full, or the store refused the write
            audit_dropped=Counter("fabric_gateway_audit_dropped", "Audit rows dropped (queue full or write failed)",
                                  ["reason"], registry=reg),
            # RSS, fds, threads, asyncio tasks of this process (not summed in multiprocess mode)
            runtime=runtime_metrics.install(reg),
            usage_missing=Counter("fabric_gateway_usage_missing", "Generating calls answered without usage, "
                                  "charged max_tokens (or 1)", ["endpoint"], registry=reg),
            shadow_refusals=Counter("fabric_gateway_shadow_refusals", "Calls a limit in shadow mode "
                                    "(FABRIC_<LIMIT>_SHADOW=1) would have refused", ["limit"], registry=reg),
            usage_dropped=Counter("fabric_gateway_usage_dropped", "Usage records dropped (queue_full, "
                                  "write_failed, row_cap)", ["reason"], registry=reg),
            # the same series fabricd exports (FabricStoreUnreachable); probed at each scrape
            migrations=Counter("fabric_gateway_stream_migrations", "Streams cut by their replica, by outcome "
                               "(moved, ended, not_moved)", ["endpoint", "outcome"], registry=reg),
            store_up=Gauge("fabric_store_up", "1 when this process read the store at the last scrape",
                           registry=reg, multiprocess_mode="livemin"),
            readings_age=Gauge("fabric_gateway_readings_age_seconds", "Seconds since the replicas' readings "
                               "(streamed between confirmations) were last confirmed against the store",
                               registry=reg, multiprocess_mode="livemax"),
        )

    def _child(self, metric, *labels):
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _tallied(self, metric, *labels):
        """A per-call metric's child behind gateway.metric_tally (inc/dec/observe as plain
        arithmetic, folded into the child before a scrape and within a second)."""
        if self._direct:
            return self._child(metric, *labels)
        key = (id(metric), labels)
        pending = self._children.get(key)
        if pending is None:
            child = metric.labels(*labels)
            pending = self._children[key] = (self._tally.histogram(child) if isinstance(metric, Histogram)
                                             else self._tally.counter(child))
        return pending

    def in_flight_for(self, endpoint: str):
        return self._tallied(self.in_flight, endpoint)

    def ttft_for(self, endpoint: str):
        return self._tallied(self.ttft, endpoint)

    def tokens_for(self, endpoint: str, model: str):
        return self._tallied(self.tokens, endpoint, model)

    def count(self, metric: Counter, endpoint: str) -> None:
        self._child(metric, endpoint).inc()

    def waiting_in(self, endpoint: str, band: str, n: int) -> None:
        self._child(self.waiting, endpoint, band).set(n)

    def audit_drop(self, reason: str, n: int) -> None:
        self.audit_dropped.labels(reason).inc(n)

    def usage_drop(self, reason: str, n: int) -> None:
        if self.usage_dropped is not None:
            self.usage_dropped.labels(reason).inc(n)

    def migration(self, endpoint: str, outcome: str) -> None:
        if self.migrations is not None:
            self._child(self.migrations, endpoint, outcome).inc()

    def key_state(self, endpoint: str, key: int, value: int) -> None:
        self._child(self.provider_keys, endpoint, str(key)).set(value)

    def outcome(self, endpoint: str, outcome: str, seconds: float | None = None) -> None:
        outcome = outcome if outcome in OUTCOMES else "error"
        self._tallied(self.requests, endpoint, outcome).inc()
        if seconds is not None:
            self._tallied(self.latency, endpoint, outcome).observe(seconds)

    def exposition(self) -> bytes:
        """Prometheus text. With several worker processes (PROMETHEUS_MULTIPROC_DIR set by
        `serve --workers N`), the sum over every worker, whichever one answers the scrape."""
        self._tally.fold()
        if self._direct:  # several workers: each one's values are in the multiprocess directory
            from prometheus_client import multiprocess

            reg = CollectorRegistry()
            multiprocess.MultiProcessCollector(reg)
            return generate_latest(reg)
        return generate_latest(self.registry)
