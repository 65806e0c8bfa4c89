"""gateway.metric_tally: the per-call metrics tallied in plain Python expose exactly what
prometheus_client writes for the same updates, before every scrape and after the fold timer."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway import metric_tally
from gateway.metrics import LATENCY_BUCKETS, GatewayMetrics
from gateway.settings import load

# latencies on, between and beyond the bucket bounds (a bound itself falls in its own bucket)
SECONDS = [0.0, 0.004, 0.005, 0.0050001, 0.01, 0.3, 2.5, 7, 59.9, 120, 121, 1e6]


def samples(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")}


def reference() -> tuple[CollectorRegistry, dict]:
    reg = CollectorRegistry()
    return reg, {
        "requests": Counter("fabric_gateway_requests", "x", ["endpoint", "outcome"], registry=reg),
        "tokens": Counter("fabric_gateway_tokens", "x", ["endpoint", "model"], registry=reg),
        "ttft": Histogram("fabric_gateway_ttft_seconds", "x", ["endpoint"], buckets=LATENCY_BUCKETS, registry=reg),
        "latency": Histogram("fabric_gateway_latency_seconds", "x", ["endpoint", "outcome"], buckets=LATENCY_BUCKETS,
                             registry=reg),
        "in_flight": Gauge("fabric_gateway_in_flight", "x", ["endpoint"], registry=reg),
    }


def fed(metrics: GatewayMetrics, ref: dict) -> None:
    for i, s in enumerate(SECONDS):
        outcome = ("success", "refused", "not-an-outcome")[i % 3]
        metrics.outcome("ep", outcome, s)
        ref["requests"].labels("ep", outcome if outcome != "not-an-outcome" else "error").inc()
        ref["latency"].labels("ep", outcome if outcome != "not-an-outcome" else "error").observe(s)
        metrics.ttft_for("ep").observe(s / 2)
        ref["ttft"].labels("ep").observe(s / 2)
        metrics.tokens_for("ep", "m").inc(i)
        ref["tokens"].labels("ep", "m").inc(i)
        metrics.in_flight_for("ep").inc()
        ref["in_flight"].labels("ep").inc()
        if i % 2:
            metrics.in_flight_for("ep").dec()
            ref["in_flight"].labels("ep").dec()
    metrics.outcome("other", "success")  # no latency: the counter alone
    ref["requests"].labels("other", "success").inc()


def mine(metrics: GatewayMetrics) -> dict:
    wanted = {"fabric_gateway_requests", "fabric_gateway_tokens", "fabric_gateway_ttft_seconds",
              "fabric_gateway_latency_seconds", "fabric_gateway_in_flight"}
    return {k: v for k, v in samples(metrics.registry).items()
            if k[0].removesuffix("_total").removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            in wanted}


def test_a_scrape_shows_every_update_as_prometheus_client_would():
    async def main():
        metrics = GatewayMetrics.create()
        ref_reg, ref = reference()
        fed(metrics, ref)
        before = mine(metrics)
        assert not any(v for (name, _), v in before.items() if name.startswith("fabric_gateway_requests")), \
            "updates are pending until a fold"
        metrics.exposition()  # folds
        assert mine(metrics) == samples(ref_reg)
        fed(metrics, ref)  # a second round on the same children adds to the first
        text = metrics.exposition().decode()
        # sums added in another order may differ in the last bit; every count is exact
        assert mine(metrics) == pytest.approx(samples(ref_reg), rel=1e-12)
        assert mine(metrics).keys() == samples(ref_reg).keys()
        assert 'fabric_gateway_in_flight{endpoint="ep"} 12.0' in text

    asyncio.run(main())


def test_updates_fold_on_their_own_within_the_fold_interval(monkeypatch):
    monkeypatch.setattr(metric_tally, "FOLD_SECS", 0.01)

    async def main():
        metrics = GatewayMetrics.create()
        metrics.outcome("ep", "success", 0.2)
        await asyncio.sleep(0.2)
        assert metrics.registry.get_sample_value("fabric_gateway_requests_total",
                                                 {"endpoint": "ep", "outcome": "success"}) == 1
        assert metrics.registry.get_sample_value("fabric_gateway_latency_seconds_bucket",
                                                 {"endpoint": "ep", "outcome": "success", "le": "0.25"}) == 1
        assert not metrics._tally.armed  # nothing pending: no timer while idle

    asyncio.run(main())


def test_without_an_event_loop_an_update_folds_at_once():
    metrics = GatewayMetrics.create()
    metrics.outcome("ep", "refused", 0.02)
    assert metrics.registry.get_sample_value("fabric_gateway_latency_seconds_count",
                                             {"endpoint": "ep", "outcome": "refused"}) == 1


def test_with_several_workers_every_update_is_in_the_files_at_once(monkeypatch, tmp_path):
    """Multiprocess mode: another worker answering the scrape reads this worker's values from
    its files, so nothing may wait for a fold."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # for prometheus_client, as serve sets it
    assert load().metrics_multiprocess  # the gateway's settings see it at start

    async def main():
        metrics = GatewayMetrics.create(multiprocess=load().metrics_multiprocess)
        metrics.outcome("ep", "success", 0.2)
        metrics.in_flight_for("ep").inc()
        assert metrics.registry.get_sample_value("fabric_gateway_requests_total",
                                                 {"endpoint": "ep", "outcome": "success"}) == 1
        assert not metrics._tally.armed

    asyncio.run(main())
