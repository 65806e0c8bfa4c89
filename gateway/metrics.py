"""Prometheus metrics for the gateway, in a registry owned by the app (never a module global).

Labels come only from the catalogue: the endpoint name once it has resolved in the store, the
model when it is a registered model (else "unknown"), and a fixed set of outcomes -- so a caller
cannot blow up label cardinality, and no key, tenant secret or prompt is ever a label.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

OUTCOMES = ("success", "upstream_error", "client_closed", "refused", "unauthorized", "rate_limited", "error")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    tokens: Counter
    ttft: Histogram
    latency: Histogram
    in_flight: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> GatewayMetrics:
        reg = registry or CollectorRegistry()
        return cls(
            registry=reg,
            requests=Counter("fabric_gateway_requests", "Gateway calls by endpoint and outcome",
                             ["endpoint", "outcome"], registry=reg),
            tokens=Counter("fabric_gateway_tokens", "Tokens counted from upstream usage",
                           ["endpoint", "model"], registry=reg),
            ttft=Histogram("fabric_gateway_ttft_seconds", "Time to the first upstream byte",
                           ["endpoint"], buckets=LATENCY_BUCKETS, registry=reg),
            latency=Histogram("fabric_gateway_latency_seconds", "Whole-call latency",
                              ["endpoint", "outcome"], buckets=LATENCY_BUCKETS, registry=reg),
            in_flight=Gauge("fabric_gateway_in_flight", "Calls being proxied now", ["endpoint"], registry=reg),
        )

    def outcome(self, endpoint: str, outcome: str, seconds: float | None = None) -> None:
        outcome = outcome if outcome in OUTCOMES else "error"
        self.requests.labels(endpoint, outcome).inc()
        if seconds is not None:
            self.latency.labels(endpoint, outcome).observe(seconds)
