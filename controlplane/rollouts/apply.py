"""Applies rollout plans (thin): one pass per routing tick, under the leader lease.

The routing job calls ``advance(replicas, observations)`` right after its scrape, so canary
windows are judged on this tick's engine counters and a changed share reaches the agents in the
same tick. For each active rollout: plan_rollout, then Activate / Supersede (idempotent
writes of the deployment and revision records), then SaveRecord (compare-and-swap: when an
operator action changed the record meanwhile, this tick's plan is dropped and the next tick
plans from the operator's record), then the events. The store is the leader's FencedStore, so
a process that lost the lease stops before its next write. The reconciler reads the saved
targets; the routing job splits weights by the saved share.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from prometheus_client import Counter, Gauge

from common.records import rollouts as rollout_records
from common.records.events import record_event
from common.rollouts import Rollout
from common.schemas import Replica, ReplicaObservation
from common.store.base import Store
from controlplane.rollouts.plan import Activate, Event, SaveRecord, Supersede, plan_rollout

log = logging.getLogger("fabricd.rollouts")


class RolloutMetrics:
    """fabric_rollout_share{deployment} (the new set's share while a rollout splits, gone when
    it ends) and fabric_rollout_transitions_total{action} (one per event: step, switched, paused,
    rollback, succeeded, rolled-back)."""

    def __init__(self, registry):
        self.share = Gauge("fabric_rollout_share", "Percent of new connections to the new revision",
                           ["deployment"], registry=registry)
        self.transitions = Counter("fabric_rollout_transitions_total", "Rollout transitions by action",
                                   ["action"], registry=registry)


class RolloutWorker:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time, events_kept: int = 1000,
                 metrics: RolloutMetrics | None = None):
        self.store = store
        self.clock = clock
        self.events_kept = events_kept
        self.metrics = metrics
        self.active: dict[str, Rollout] = {}  # what the last pass left, for the routing split

    def advance(self, replicas: Mapping[str, list[Replica]],
                observations: Mapping[str, ReplicaObservation]) -> dict[str, Rollout]:
        now = self.clock()
        out: dict[str, Rollout] = {}
        for dep, (record, mod) in sorted(rollout_records.active_rollouts(self.store).items()):
            actions = plan_rollout(record, replicas.get(dep, []), observations, now)
            saved = record
            for a in actions:  # Activate and Supersede before the record says it is over
                if isinstance(a, Activate):
                    rev = rollout_records.get_revision(self.store, dep, a.revision)
                    if rev is not None:
                        rollout_records.activate(self.store, dep, rev)
                elif isinstance(a, Supersede):
                    rollout_records.mark_superseded(self.store, dep, a.revision, now)
            for a in actions:
                if isinstance(a, SaveRecord):
                    if not rollout_records.save_rollout(self.store, a.record, mod):
                        log.info("rollout %s of %s changed meanwhile; planning again next tick", record.id, dep)
                        break
                    saved = a.record
                elif isinstance(a, Event):
                    log.info("%s: %s", dep, a.message)
                    if self.metrics is not None:
                        self.metrics.transitions.labels(a.action).inc()
                    # Each its own clock reading: events of one pass keep their order in the log.
                    record_event(self.store, "rollout", dep, a.action, a.message, keep=self.events_kept)
            if saved.active:
                out[dep] = saved
        if self.metrics is not None:
            for dep in set(self.active) - {d for d, r in out.items() if r.share is not None}:
                try:
                    self.metrics.share.remove(dep)
                except KeyError:
                    pass
            for dep, rec in out.items():
                if rec.share is not None:
                    self.metrics.share.labels(dep).set(rec.share)
        self.active = out
        return out
