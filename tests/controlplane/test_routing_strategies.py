"""Routing: vLLM /metrics parsing (0.6 and 0.10 pages), deltas, eligibility, every strategy."""

from pathlib import Path

import pytest

from common.engine_metrics.parse import (
    MetricsParseError,
    failed_observation,
    histogram_quantile,
    observe,
    parse_vllm_metrics,
)
from common.schemas import InferenceEndpoint, ReplicaObservation, Site
from controlplane.routing.strategies import STRATEGIES, UNREAD_WEIGHT, plan_routing, to_weight
from tests.controlplane.planner_data import NOW, gpu, node, replica

FIXTURES = Path(__file__).parent / "fixtures"
V06 = (FIXTURES / "vllm_0_6_metrics.txt").read_text()
V010 = (FIXTURES / "vllm_0_10_metrics.txt").read_text()


def test_parses_old_and_new_kv_gauge_names():
    old, new = parse_vllm_metrics(V06), parse_vllm_metrics(V010)
    assert (old.waiting, old.running, old.kv_cache_usage) == (3, 5, 0.42)
    assert (new.waiting, new.running, new.kv_cache_usage) == (0, 12, 0.17)
    assert new.failed == 40 and new.finished == 1000 and old.failed == 0


def test_garbage_is_a_parse_error():
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics("<html>502 Bad Gateway</html>")
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics("# TYPE up gauge\nup 1\n")


def bump(text, name, factor):
    """The same page with one metric family's samples multiplied (a later scrape)."""
    out = []
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) * factor}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_rates_come_from_deltas_between_scrapes():
    first = parse_vllm_metrics(V010)
    later = parse_vllm_metrics(bump(bump(V010, "vllm:generation_tokens_total", 1.1), "vllm:request_success_total", 2))
    obs = observe("r", later, first, 10.0, NOW)
    assert obs.tokens_per_s == pytest.approx(2500.0)  # 25000 tokens in 10 s
    assert obs.failure_ratio == pytest.approx(0.04)
    assert obs.ttft_p50_s is None  # no new first tokens in the window
    restarted = observe("r", first, later, 10.0, NOW)  # counters went down: engine restarted
    assert restarted.tokens_per_s == pytest.approx(25000.0)


def test_ttft_p50_from_histogram_delta():
    first = parse_vllm_metrics(V06)
    later = parse_vllm_metrics(bump(V06, "vllm:time_to_first_token_seconds", 2))
    assert observe("r", later, first, 10, NOW).ttft_p50_s == pytest.approx(0.088)
    assert histogram_quantile(0.5, ()) is None


def ep(routing="equal", **kw):
    return InferenceEndpoint(name="qwen-openai", deployment="qwen", routing=routing, **kw)


def ob(rid, *, queue=0.0, kv=0.0, ttft=None, tps=None, fail=None, age=1.0, ok=True):
    return ReplicaObservation(replica_id=rid, scraped_at=NOW - age, ok=ok, queue_depth=queue,
                              kv_cache_usage=kv, ttft_p50_s=ttft, tokens_per_s=tps, failure_ratio=fail,
                              error="" if ok else "timeout")


NODES = {"n1": node("n1", 4, site="eu"), "n2": node("n2", 4, site="us"), "n3": node("n3", 4, site="us")}
REPS = [replica(0, "n1", host="10.0.0.1"), replica(1, "n2", host="10.0.0.2"), replica(2, "n3", host="10.0.0.3")]
IDS = [r.replica_id for r in REPS]


def weights_for(routing, obs, **kw):
    sites = kw.pop("sites", None)
    nodes = kw.pop("nodes", NODES)
    plan = plan_routing(ep(routing, **kw), REPS, {o.replica_id: o for o in obs}, nodes, NOW, sites=sites)
    return [plan.weights.get(i) for i in IDS]


@pytest.mark.parametrize(
    "routing, obs, kw, expected",
    [
        ("equal", [ob(IDS[0], queue=9), ob(IDS[1]), ob(IDS[2])], {}, [1, 1, 1]),
        ("least_queue", [ob(IDS[0], queue=0), ob(IDS[1], queue=1), ob(IDS[2], queue=30)], {}, [32, 17, 2]),
        ("lowest_ttft", [ob(IDS[0], ttft=0.1), ob(IDS[1], ttft=0.2), ob(IDS[2])], {}, [32, 17, 32]),
        ("most_free_vram", [ob(IDS[0], kv=0.0), ob(IDS[1], kv=0.5), ob(IDS[2], kv=1.0)], {}, [32, 17, 1]),
        ("weighted_capacity", [ob(IDS[0]), ob(IDS[1], queue=1, kv=0.5), ob(IDS[2], queue=1, kv=1.0)], {},
         [32, 17, 9]),
        # us has room (n2 idle): eu, not a failover site of us, takes nothing (common.sites.spill)
        ("site_local", [ob(IDS[0]), ob(IDS[1]), ob(IDS[2], kv=1.0, queue=3)], {"preferred_site": "us"},
         [None, 32, 11]),
        ("site_local", [ob(IDS[0]), ob(IDS[1]), ob(IDS[2])], {}, [32, 32, 32]),  # no preferred site
        ("cost_optimized", [ob(i) for i in IDS],
         {"sites": {"eu": Site(name="eu", cost_tier=1), "us": Site(name="us", cost_tier=4)}}, [32, 9, 9]),
        ("cost_optimized", [ob(i) for i in IDS], {}, [32, 32, 32]),  # no site records: all tier 1
        ("energy_optimized", [ob(IDS[0], kv=0.2), ob(IDS[1], kv=0.6), ob(IDS[2], kv=0.6)], {}, [26, 13, 13]),
        ("highest_throughput", [ob(IDS[0], tps=1000), ob(IDS[1], tps=500), ob(IDS[2])], {}, [32, 17, 1]),
        ("highest_throughput", [ob(i) for i in IDS], {}, [32, 32, 32]),
        ("lowest_failure", [ob(IDS[0], fail=0.0), ob(IDS[1], fail=0.5), ob(IDS[2])], {}, [32, 17, 32]),
    ],
)
def test_strategy_weights(routing, obs, kw, expected):
    assert weights_for(routing, obs, **kw) == expected


def test_every_strategy_is_covered_and_bounded():
    from common.schemas import ROUTING_STRATEGIES

    assert set(STRATEGIES) == set(ROUTING_STRATEGIES)
    extreme = [ob(IDS[0], queue=1e9, kv=5, ttft=1e9, tps=0, fail=1), ob(IDS[1], queue=-1, kv=-1, ttft=1e-9, tps=1e9),
               ob(IDS[2])]
    for routing in STRATEGIES:
        got = [w for w in weights_for(routing, extreme, preferred_site="us") if w is not None]
        assert got and all(1 <= w <= 32 for w in got), routing
    assert (to_weight(-3), to_weight(0.5), to_weight(7)) == (1, 17, 32)


def test_energy_uses_joules_per_token_when_known():
    nodes = {"n1": node("n1", gpus=[gpu(0, power=200)]), "n2": node("n2", gpus=[gpu(1, power=400)]),
             "n3": node("n3", gpus=[gpu(2, power=400)])}
    obs = [ob(IDS[0], tps=100), ob(IDS[1], tps=100), ob(IDS[2], tps=400)]
    assert weights_for("energy_optimized", obs, nodes=nodes) == [17, 9, 32]


def test_eligibility_reasons_and_failed_scrape_is_never_idle():
    reps = [replica(0, host="10.0.0.1"), replica(1, ready=False, host="10.0.0.2"),
            replica(2, draining=True, host="10.0.0.3"), replica(3, host="10.0.0.4"),
            replica(4, host="10.0.0.5"), replica(5, host="10.0.0.6")]
    obs = {o.replica_id: o for o in [
        ob("qwen-0-abc", queue=4), ob("qwen-1-abc"), ob("qwen-2-abc"),
        failed_observation("qwen-3-abc", "connect timeout", NOW), ob("qwen-4-abc", age=31)]}
    plan = plan_routing(ep("least_queue"), reps, obs, {"n1": node("n1", 8)}, NOW)
    reasons = {e.replica_id: e.reason for e in plan.entries}
    assert plan.weights == {"qwen-0-abc": 7}
    assert reasons["qwen-0-abc"] == "least_queue: weight 7 from queue 4"  # names the reading
    assert "not ready" in reasons["qwen-1-abc"]
    assert reasons["qwen-2-abc"].startswith("draining")
    assert "scrape failed: connect timeout" in reasons["qwen-3-abc"]
    assert "31s old" in reasons["qwen-4-abc"]
    assert reasons["qwen-5-abc"] == "never scraped"
    # Ready with a failed or stale page (a busy engine answers /metrics late): no new flows, but it
    # stays in the Maglev service at weight 0 so its established flows keep their backend.
    assert plan.backends == (("10.0.0.1", 8000, 7), ("10.0.0.3", 8000, 0), ("10.0.0.4", 8000, 0),
                             ("10.0.0.5", 8000, 0))  # .3 is the draining one
    assert set(plan.draining) == {"10.0.0.3:8000", "10.0.0.4:8000", "10.0.0.5:8000"}
    assert "its established flows stay" in reasons["qwen-3-abc"]
    # with no fresh page anywhere, the Ready ones still take new flows, evenly (health alone)
    blind = plan_routing(ep("least_queue"), reps, {k: v for k, v in obs.items() if k != "qwen-0-abc"},
                         {"n1": node("n1", 8)}, NOW)
    assert blind.weights == {"qwen-3-abc": UNREAD_WEIGHT, "qwen-4-abc": UNREAD_WEIGHT}
    assert "no replica has a fresh page" in {e.replica_id: e.reason for e in blind.entries}["qwen-3-abc"]
    assert blind.draining == ("10.0.0.3:8000",)  # only the one really draining


def test_draining_replica_stays_in_the_service_at_weight_0_for_its_established_flows():
    """The stream-cutting bug: a draining replica left the pushed service, so the agents re-picked
    its flows onto another backend (reset). It stays as a draining backend until it is deleted."""
    reps = [replica(0, host="10.0.0.1"), replica(1, draining=True, host="10.0.0.2"),
            replica(2, draining=True, host="10.0.0.3").model_copy(update={"phase": "Deleting"}),
            replica(3, draining=True, host="engine-3.lab")]
    obs = {o.replica_id: o for o in [ob("qwen-0-abc"), ob("qwen-1-abc", queue=9)]}
    plan = plan_routing(ep("least_queue"), reps, obs, {"n1": node("n1", 8)}, NOW)
    assert plan.weights == {"qwen-0-abc": 32}  # no new traffic to a draining replica
    assert plan.backends == (("10.0.0.1", 8000, 32), ("10.0.0.2", 8000, 0))
    assert plan.draining == ("10.0.0.2:8000",)  # BACKEND_DRAINING: established flows stay
    by_id = {e.replica_id: e for e in plan.entries}
    assert not by_id["qwen-2-abc"].in_maglev  # being torn down: its VM is going
    assert not by_id["qwen-3-abc"].in_maglev  # hostname: gateway only
    # Every replica draining (a deployment delete): the service stays, all at weight 0.
    every = plan_routing(ep("least_queue"), [r.model_copy(update={"draining": True}) for r in reps[:2]], obs,
                         {"n1": node("n1", 8)}, NOW)
    assert every.backends == (("10.0.0.1", 8000, 0), ("10.0.0.2", 8000, 0)) and not every.weights


def test_sites_outside_allowed_or_residency_are_excluded():
    obs = [ob(i) for i in IDS]
    assert weights_for("site_local", obs, allowed_sites=["us"]) == [None, 32, 32]
    assert weights_for("equal", obs, residency="eu") == [1, None, None]
    nodes = {"n1": NODES["n1"]}  # n2, n3 unknown: no site
    assert weights_for("equal", obs, nodes=nodes, allowed_sites=["eu"]) == [1, None, None]


def test_maglev_backends_omit_hostnames_and_dry_run():
    reps = [replica(0, "n1", host="10.0.0.1"), replica(1, "n1", host="engine-1.lab"),
            replica(2, "dry", host="127.0.0.1")]
    nodes = {"n1": node("n1", 8), "dry": node("dry", 8, driver="dry-run")}
    obs = {r.replica_id: ob(r.replica_id) for r in reps}
    plan = plan_routing(ep("equal"), reps, obs, nodes, NOW)
    assert plan.backends == (("10.0.0.1", 8000, 1),)
    assert len(plan.weights) == 3
