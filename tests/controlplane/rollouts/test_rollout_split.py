"""Maglev weight splits: the new set's table share within one slot of the step, computed by the
same slot quotas the agent builds its table with, and the rollout's hand on a routing plan."""

from __future__ import annotations

import math
import random

import pytest

from agent.dataplane.maglev import build_maglev_indices
from common.maglev_quota import DEFAULT_SIZE, MAX_WEIGHT, slot_quotas
from controlplane.routing.rollout_weights import apply_rollout
from controlplane.routing.split import apportion, split
from controlplane.routing.strategies import RoutingEntry, RoutingPlan
from tests.controlplane.rollouts.rollout_data import NOW, news, olds, record


def sets(n_new, n_old, seed):
    rnd = random.Random(seed)
    new = {f"10.0.2.{i + 1}:8000": rnd.randint(1, MAX_WEIGHT) for i in range(n_new)}
    old = {f"10.0.1.{i + 1}:8000": rnd.randint(1, MAX_WEIGHT) for i in range(n_old)}
    return new, old


@pytest.mark.parametrize("percent", [5, 10, 20, 25, 50])
@pytest.mark.parametrize("n_old", [1, 2, 3, 4, 6, 8])
def test_step_share_lands_within_one_slot(percent, n_old):
    n_new = max(1, math.ceil(n_old * percent / 100))  # the canary's set size for that step
    for seed in range(3):
        new, old = sets(n_new, n_old, seed)
        s = split(new, old, percent)
        assert s.slot_error <= 1, (new, old, s.weights)
        assert all(0 <= w <= MAX_WEIGHT for w in s.weights.values())
        assert all(s.weights[k] >= 1 for k in new) and all(s.weights[k] >= 1 for k in old)


def test_the_agent_table_has_exactly_the_planned_share():
    new, old = sets(1, 4, 7)
    s = split(new, old, 20)
    keys, table = build_maglev_indices(s.weights, DEFAULT_SIZE)
    new_slots = sum(int((table == keys.index(k)).sum()) for k in new)
    assert new_slots == s.new_slots
    assert abs(new_slots / DEFAULT_SIZE - 0.20) <= 1 / DEFAULT_SIZE


def test_strategy_proportions_survive_inside_each_set():
    old = {"10.0.1.1:8000": 32, "10.0.1.2:8000": 8}  # the strategy gives the first 4x the second
    s = split({"10.0.2.1:8000": 16}, old, 20)
    assert s.slot_error <= 1
    assert s.weights["10.0.1.1:8000"] / s.weights["10.0.1.2:8000"] == pytest.approx(4, rel=0.25)


def test_ends_of_the_range():
    new, old = sets(2, 2, 1)
    zero = split(new, old, 0)
    assert all(zero.weights[k] == 0 for k in new) and all(zero.weights[k] == old[k] for k in old)
    full = split(new, old, 100)
    assert all(full.weights[k] == 0 for k in old) and full.table_share == 1.0


def test_a_share_no_weights_can_express_reports_its_error():
    s = split({"a:1": 1}, {"b:1": 1}, 33)  # 33:67 needs a weight above 32 with one replica a side
    # the nearest share any pair of weights 1-32 can give, found by trying every pair
    target = 0.33 * DEFAULT_SIZE
    best = min(abs(slot_quotas({"a:1": a, "b:1": b}, DEFAULT_SIZE)["a:1"] - target)
               for a in range(1, MAX_WEIGHT + 1) for b in range(1, MAX_WEIGHT + 1))
    assert best > 1  # no pair lands within one slot: the case really is inexpressible
    assert s.slot_error == pytest.approx(best)  # split found that nearest share, and says how far
    assert s.new_slots == slot_quotas(s.weights, DEFAULT_SIZE)["a:1"]


@pytest.mark.parametrize("total,base", [(3, {"a": 1, "b": 1, "c": 1}), (64, {"a": 1, "b": 31}),
                                        (40, {"a": 30, "b": 10}), (5, {"a": 32, "b": 32, "c": 1})])
def test_apportion_keeps_the_total_and_bounds(total, base):
    out = apportion(total, base)
    assert sum(out.values()) == total and all(1 <= w <= MAX_WEIGHT for w in out.values())


# -- a rollout's hand on the routing plan -----------------------------------------------------------

def plan_of(replicas, weight=10):
    entries = tuple(RoutingEntry(r.replica_id, r.ready, "equal", weight if r.ready else 0, r.host, 8000, True)
                    for r in replicas)
    return RoutingPlan("ep", "equal", entries)


def test_canary_share_splits_the_plan():
    replicas = olds(4) + news(1)
    rec = record("canary", replicas=4).model_copy(update={"share": 20})
    plan, s = apply_rollout(plan_of(replicas), replicas, rec, NOW)
    assert s is not None and s.slot_error <= 1
    w = {e.replica_id: e.weight for e in plan.entries}
    assert w["r2-0"] / (w["r2-0"] + sum(w[f"r1-{i}"] for i in range(4))) == pytest.approx(0.2)
    assert "new set" in next(e.reason for e in plan.entries if e.replica_id == "r2-0")


def test_share_zero_keeps_new_replicas_in_the_service_at_weight_zero():
    replicas = olds(2) + news(2)
    rec = record("blue-green", replicas=2)  # share 0 until the switch
    plan, _ = apply_rollout(plan_of(replicas), replicas, rec, NOW)
    assert [(h, w) for h, _p, w in plan.backends if h.startswith("10.0.2.")] == [("10.0.2.1", 0), ("10.0.2.2", 0)]
    assert all(w > 0 for h, _p, w in plan.backends if h.startswith("10.0.1."))


def test_one_set_alone_keeps_its_weights():
    replicas = olds(2, ready=False) + news(2)
    rec = record("blue-green", replicas=2).model_copy(update={"share": 100, "switched": True})
    plan, s = apply_rollout(plan_of(replicas), replicas, rec, NOW)
    assert s is None and {w for _h, _p, w in plan.backends} == {10}


def test_rolling_gives_weight_only_after_min_healthy():
    replicas = olds(2) + news(1, since=NOW - 5) + [news(2)[1]]
    plan, _ = apply_rollout(plan_of(replicas), replicas, record("rolling", min_healthy_secs=30), NOW)
    by_id = {e.replica_id: e for e in plan.entries}
    assert not by_id["r2-0"].included and "30s Ready" in by_id["r2-0"].reason
    assert by_id["r2-1"].included and by_id["r1-0"].included


def test_no_rollout_leaves_the_plan_alone():
    replicas = olds(2)
    plan = plan_of(replicas)
    assert apply_rollout(plan, replicas, None, NOW) == (plan, None)


def test_rollout_worker_exports_share_and_transitions(tmp_path):
    """The worker's pass against a real SQLite store: the record advances, an event and the
    Prometheus series follow; the share series goes when the rollout ends."""
    from prometheus_client import CollectorRegistry

    from common import keyspace
    from common.records import rollouts as rollout_records
    from common.store.sqlite_store import SqliteStore
    from controlplane.rollouts.apply import RolloutMetrics, RolloutWorker

    store = SqliteStore(tmp_path / "s.db")
    registry = CollectorRegistry()
    worker = RolloutWorker(store, clock=lambda: NOW, metrics=RolloutMetrics(registry))
    rollout_records.create_rollout(store, record("canary", replicas=4))
    replicas = {"qwen": olds(4) + news(1)}
    assert worker.advance(replicas, {})["qwen"].share == 5
    assert registry.get_sample_value("fabric_rollout_share", {"deployment": "qwen"}) == 5
    assert registry.get_sample_value("fabric_rollout_transitions_total", {"action": "step"}) == 1
    stored, _mod = rollout_records.get_rollout(store, "qwen", 1)
    assert stored.share == 5 and stored.step_started_at == NOW
    store.put(keyspace.rollouts("qwen", 1), stored.model_copy(update={"phase": "RolledBack"}).model_dump_json())
    assert worker.advance(replicas, {}) == {}
    assert registry.get_sample_value("fabric_rollout_share", {"deployment": "qwen"}) is None
    store.close()
