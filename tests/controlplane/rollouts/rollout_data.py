"""Plain-data builders for the rollout planner tests."""

from __future__ import annotations

from common.rollouts import RolloutRequest
from common.schemas import Replica, ReplicaObservation
from controlplane.rollouts import operate
from controlplane.rollouts.plan import Activate, Event, SaveRecord, Supersede, plan_rollout

NOW = 1_000_000.0


def record(strategy="rolling", replicas=3, **kw):
    req = RolloutRequest(strategy=strategy, **kw)
    return operate.start(req, rollout_id=1, deployment="qwen", from_revision=1, to_revision=2,
                         replicas=replicas, who="admin", now=NOW - 1000)


def rep(i, rev, *, ready=True, since=NOW - 1000, draining=False, phase=None, host=None):
    return Replica(replica_id=f"r{rev}-{i}", deployment="qwen", ordinal=i + 10 * rev, revision=rev, node="n1",
                   host=host or f"10.0.{rev}.{i + 1}", ready=ready, ready_since=since if ready else None,
                   draining=draining, phase=phase or ("Draining" if draining else "Ready" if ready else "Starting"),
                   created_at=NOW - 2000)


def olds(n, **kw):
    return [rep(i, 1, **kw) for i in range(n)]


def news(n, **kw):
    return [rep(i, 2, **kw) for i in range(n)]


def counters(rid, finished=0.0, failed=0.0, ttft_sum=0.0, ttft_count=0.0, ok=True):
    return ReplicaObservation(replica_id=rid, scraped_at=NOW, ok=ok, finished_total=finished, failed_total=failed,
                              ttft_sum_s=ttft_sum, ttft_count=ttft_count)


class Result:
    def __init__(self, before, actions):
        saved = [a.record for a in actions if isinstance(a, SaveRecord)]
        self.record = saved[0] if saved else before
        self.saved = bool(saved)
        self.events = [a.action for a in actions if isinstance(a, Event)]
        self.messages = [a.message for a in actions if isinstance(a, Event)]
        self.activate = [a.revision for a in actions if isinstance(a, Activate)]
        self.supersede = [a.revision for a in actions if isinstance(a, Supersede)]


def step(rec, replicas, obs=None, now=NOW):
    obs = {o.replica_id: o for o in (obs or [])}
    return Result(rec, plan_rollout(rec, replicas, obs, now))
