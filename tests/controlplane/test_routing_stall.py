"""The stall detector: running requests with no token progress for stall_s take weight 0 (kept in
the Maglev service for their flows) and record one event; unknown progress is never a stall."""

import asyncio

import pytest

from common.schemas import ReplicaObservation
from controlplane.placement import vip_pool
from controlplane.routing.controller import RoutingWorker
from controlplane.routing.stall import mark, stall_since
from controlplane.routing.strategies import plan_routing
from tests.controlplane.planner_data import NOW, node, replica
from tests.controlplane.test_routing_strategies import ep


def obs(t, running=2.0, tps=0.0, ok=True):
    return ReplicaObservation(replica_id="qwen-0-abc", scraped_at=t, ok=ok, running=running, tokens_per_s=tps)


@pytest.mark.parametrize("previous,o,expected", [
    (None, obs(NOW), NOW),  # running, no tokens: starts now
    (NOW - 30, obs(NOW), NOW - 30),  # still: keeps its start
    (NOW - 30, obs(NOW, tps=50.0), None),  # tokens advance
    (NOW - 30, obs(NOW, running=0.0), None),  # nothing running is idle, not stalled
    (NOW - 30, obs(NOW, tps=None), None),  # no counter (or first scrape): unknown is not a stall
    (NOW - 30, obs(NOW, ok=False), None),  # a failed scrape says nothing
])
def test_stall_since(previous, o, expected):
    assert stall_since(previous, o) == expected


def test_a_stalled_replica_gets_weight_0_but_stays_in_the_service():
    reps = [replica(0, host="10.0.0.1"), replica(1, host="10.0.0.2")]
    stalled = mark(obs(NOW), NOW - 61, 60.0)
    assert stalled.stalled and not mark(obs(NOW), NOW - 59, 60.0).stalled
    other = ReplicaObservation(replica_id="qwen-1-abc", scraped_at=NOW, ok=True)
    plan = plan_routing(ep("least_queue"), reps, {"qwen-0-abc": stalled, "qwen-1-abc": other},
                        {"n1": node("n1", 8)}, NOW)
    assert plan.weights == {"qwen-1-abc": 32}
    assert ("10.0.0.1", 8000, 0) in plan.backends and plan.draining == ("10.0.0.1:8000",)
    assert "stalled: 2 requests running" in next(e.reason for e in plan.entries if e.replica_id == "qwen-0-abc")


class Events:
    def __init__(self):
        self.seen = []

    def __call__(self, kind, name, reason, message, **kw):
        self.seen.append(reason)


def test_the_controller_records_one_event_per_transition(tmp_path):
    from common.store.sqlite_store import SqliteStore

    store = SqliteStore(tmp_path / "f.db")
    events = Events()
    worker = RoutingWorker(store, None, vip_pool.parse_pool("10.96.0.0/30"), events=events, stall_s=60.0)
    r = replica(0, host="10.0.0.1")
    for t in (NOW, NOW + 30, NOW + 61, NOW + 90):
        worker._stall(r, obs(t))
    assert events.seen == ["ReplicaStalled"]
    assert not worker._stall(r, obs(NOW + 100, tps=20.0)).stalled
    assert events.seen == ["ReplicaStalled", "ReplicaUnstalled"]
    asyncio.run(worker.aclose())
    store.close()
