"""site_local spill and residency in the routing planner (common.sites through plan_routing)."""

import pytest

from common.schemas import InferenceEndpoint, ReplicaObservation, Site
from controlplane.routing.strategies import plan_routing
from tests.controlplane.planner_data import NOW, node, replica

NODES = {"a": node("a", site="eu-1"), "b": node("b", site="eu-2"), "c": node("c", site="us-1"),
         "d": node("d", site="")}
REPS = [replica(0, "a", host="10.0.0.1"), replica(1, "b", host="10.0.0.2"), replica(2, "c", host="10.0.0.3"),
        replica(3, "d", host="10.0.0.4")]
SITES = {"eu-1": Site(name="eu-1", residency="europe", failover_sites=["eu-2"], cost_tier=2),
         "eu-2": Site(name="eu-2", residency="europe", cost_tier=1),
         "us-1": Site(name="us-1", residency="usa", cost_tier=0.5)}


def ob(i, queue=0.0, kv=0.0):
    return ReplicaObservation(replica_id=f"qwen-{i}-abc", scraped_at=NOW - 1, ok=True, queue_depth=queue,
                              kv_cache_usage=kv)


def plan(obs, reps=REPS, **kw):
    ep = InferenceEndpoint(name="e", deployment="qwen", **kw)
    return plan_routing(ep, reps, {o.replica_id: o for o in obs}, NODES, NOW, sites=SITES)


def weights(p):
    return [p.weights.get(f"qwen-{i}-abc") for i in range(4)]


def reasons(p):
    return {e.replica_id[:6]: e.reason for e in p.entries}


def test_preferred_site_with_room_serves_alone():
    p = plan([ob(0, queue=1), ob(1), ob(2), ob(3)], routing="site_local", preferred_site="eu-1")
    assert weights(p) == [p.weights["qwen-0-abc"], None, None, None]
    assert "preferred site 'eu-1' has room" in reasons(p)["qwen-1"]


@pytest.mark.parametrize("full", [{"queue": 4}, {"kv": 0.95}])
def test_saturated_preferred_site_spills_only_to_its_failover_sites(full):
    p = plan([ob(0, **full), ob(1), ob(2), ob(3)], routing="site_local", preferred_site="eu-1")
    w = weights(p)
    assert w[0] is not None and w[1] is not None  # eu-1 keeps serving, eu-2 (its failover) joins
    assert w[2] is None and w[3] is None  # us-1 is not a failover site; the site-less node never serves
    assert "spilling to failover site(s) eu-2" in reasons(p)["qwen-2"]
    assert "spilling to failover site(s) eu-2" in reasons(p)["qwen-1"]  # the included say why too


def test_saturated_without_failover_replica_spills_nowhere():
    reps = [REPS[0], REPS[2]]
    p = plan([ob(0, queue=9), ob(2)], reps=reps, routing="site_local", preferred_site="eu-1")
    assert p.weights == {"qwen-0-abc": p.weights["qwen-0-abc"]}
    assert "no failover site has an eligible replica" in reasons(p)["qwen-2"]


def test_preferred_site_down_failover_serves_then_any_site():
    p = plan([ob(1), ob(2), ob(3)], reps=REPS[1:], routing="site_local", preferred_site="eu-1")
    assert set(p.weights) == {"qwen-1-abc"}
    p = plan([ob(2), ob(3)], reps=REPS[2:], routing="site_local", preferred_site="eu-1")
    assert set(p.weights) == {"qwen-2-abc", "qwen-3-abc"}  # nothing in eu-1/eu-2: every eligible site


def test_spill_never_leaves_residency_or_allowed_sites():
    obs = [ob(0, queue=9), ob(1), ob(2), ob(3)]
    p = plan(obs, routing="site_local", preferred_site="eu-1", residency="europe")
    assert set(p.weights) == {"qwen-0-abc", "qwen-1-abc"}
    r = reasons(p)
    assert "outside residency 'europe' (its residency is 'usa')" in r["qwen-2"]
    assert "no site" in r["qwen-3"]  # a node with no site is out once residency is set
    p = plan(obs, routing="site_local", preferred_site="eu-1", allowed_sites=["eu-1"])
    assert set(p.weights) == {"qwen-0-abc"}  # eu-2 is its failover but not allowed


def test_cost_optimized_reads_the_site_cost_tier():
    p = plan([ob(0), ob(1), ob(2), ob(3)], routing="cost_optimized")
    # us-1 (0.5) is cheapest; eu-2 (1) and the site-less node (tier 1) half as good; eu-1 (2) a quarter
    assert weights(p) == [9, 17, 32, 17]
