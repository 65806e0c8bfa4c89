"""The autoscaler loop: read the store, run decide for every autoscaled deployment, apply.

Runs every FABRIC_AUTOSCALE_SECS (15 s) as one of controlplane.controllers' leader-only jobs, so
its store is the FencedStore: each write checks the leader lease right before it happens.
Applying a decision is one compare-and-swap of the deployment record (``replicas`` and the
status note), against the record the decision was made from: if an operator scaled meanwhile,
nothing is written and the next tick decides again. A scale-out of a tenant's deployment also
re-checks the GPU quota on fresh reads under the tenant's admission lock and writes before
releasing it (controlplane.tenancy.admission), so it cannot race an API create or scale. The reconciler then creates replicas, or
drains the one with the least work (controlplane.reconcile_plan).

What lands where:
  - ``status.scaling`` holds the decision ("scale out to 3: queue 31 > 20 for 30s"), and
    ``status.message`` ends with "; autoscaler: " and that decision (the reconciler keeps that
    tail, see ``with_note``). Both are written when the decision's code changes or it scales,
    not every tick, so a steady deployment causes no writes;
  - the memory (when each condition started holding, the last change) under
    keyspace.scaling(name), written only when it changes, so a new leader continues the timers;
  - an event per change of decision code (scaled out/in, quota refusal, holds), never per tick.
``plan_for`` is shared with GET /api/ai/explain/scaling/{name}: the explanation is what the next
tick would decide.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict

from common.errors import TransientError
from common.records import autoscaling, deployments
from common.records.events import EventSink
from common.schemas import InferenceDeployment
from common.store.base import Store
from controlplane.history import HISTORY
from controlplane.orchestration_state import Snapshot, load_snapshot
from controlplane.scaling.decide import Decision, Memory, Observations, QuotaView, decide
from controlplane.tenancy import admission, quotas

log = logging.getLogger("fabricd.scaling")
ADMISSION_WAIT_S = 2.0  # a tick does not wait long for a busy tenant; the next tick retries
NOTE_SEP = "; autoscaler: "
REASONS = {"scale_out": "ScaledOut", "scale_in": "ScaledIn"}


def with_note(message: str, note: str) -> str:
    """The status message with the autoscaler's note as its tail (replacing an older one)."""
    base = message.split(NOTE_SEP, 1)[0]
    return f"{base}{NOTE_SEP}{note}" if note else base


def load_memory(store: Store, name: str) -> Memory:
    value = autoscaling.memory(store, name)
    if value is None:
        return Memory()
    try:
        return Memory(**value)
    except (ValueError, TypeError):
        return Memory()


def demand_at(store: Store, snap: Snapshot, deployment: str) -> float | None:
    """The latest gateway call recorded for any endpoint of the deployment."""
    latest = None
    for ep in snap.endpoints.values():
        if ep.deployment != deployment:
            continue
        at = autoscaling.demand_at(store, ep.name)
        if at is not None and (latest is None or at > latest):
            latest = at
    return latest


def quota_view(store: Store, snap: Snapshot, dep: InferenceDeployment) -> QuotaView | None:
    quota = quotas.load_quota(store, dep.tenant)
    if quota is None or dep.tenant is None:
        return None
    amounts = quotas.per_replica(store)
    records = [d.model_dump() for d in snap.deployments.values()]
    return QuotaView(dep.tenant, quota, quotas.usage(records, dep.tenant, amounts),
                     amounts.get(dep.profile, quotas.UNKNOWN_PROFILE))


def plan_for(store: Store, snap: Snapshot, dep: InferenceDeployment, now: float) -> tuple[Decision, Memory]:
    """The decision the next tick makes for ``dep``, and the memory it was made from."""
    memory = load_memory(store, dep.name)
    obs = Observations(replicas=snap.replicas.get(dep.name, []), metrics=snap.observations,
                       demand_at=demand_at(store, snap, dep.name), quota=quota_view(store, snap, dep))
    return decide(dep, dep.autoscaling, obs, now, memory), memory


class AutoscaleWorker:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time, events: EventSink | None = None,
                 metrics=None):
        self.store = store
        self.metrics = metrics  # ControllerMetrics: fabric_autoscaler_decisions_total{action,code}
        self.clock = clock
        self.events = events or EventSink(store)
        self.due_at: float | None = None
        self._last_codes: dict[str, str] = {}

    async def tick(self) -> None:
        snap = load_snapshot(self.store)
        self.due_at = None
        marks = {}  # deployment -> the decision that changed, marked on the console's timeline
        for name in sorted(snap.deployments):
            dep = snap.deployments[name]
            if dep.autoscaling is None:
                continue
            decision = self.apply(snap, dep, snap.deployment_revisions[name])
            if decision.action != "hold" or decision.code != self._last_codes.get(name):
                marks[name] = decision.summary
            self._last_codes[name] = decision.code
            if decision.due_at is not None:
                self.due_at = decision.due_at if self.due_at is None else min(self.due_at, decision.due_at)
        HISTORY.observe_fleet(snap, marks, self.clock())  # controlplane.history

    def next_due(self) -> float | None:
        """When (wall clock) a condition that is holding will have held long enough: the loop runs
        the next tick then instead of up to one period later."""
        return self.due_at

    def apply(self, snap: Snapshot, dep: InferenceDeployment, mod_revision: int) -> Decision:
        now = self.clock()
        decision, memory = plan_for(self.store, snap, dep, now)
        changed = decision.action != "hold" or decision.code != memory.last_code
        if changed and not self._write(dep, mod_revision, decision, now):
            return decision  # the record changed since the snapshot: decide again next tick
        if decision.memory != memory:
            autoscaling.put_memory(self.store, dep.name, asdict(decision.memory))
        if changed and self.metrics is not None:
            self.metrics.autoscale_decisions.labels(decision.action, decision.code).inc()
        if changed:
            reason = REASONS.get(decision.action, "QuotaRefused" if decision.code == "quota" else "ScalingHeld")
            self.events("deployment", dep.name, reason, f"autoscaler: {decision.summary}", tenant=dep.tenant,
                        now=now, warning=decision.code in ("quota", "stale_metrics"))
            log.info("deployment %s: %s", dep.name, decision.summary)
        return decision

    def _write(self, dep: InferenceDeployment, mod_revision: int, decision: Decision, now: float) -> bool:
        if decision.action != "scale_out" or dep.tenant is None:
            return self._cas(dep, mod_revision, decision, now)
        # A scale-out adds GPUs: check the quota again on fresh reads under the tenant's admission
        # lock, and write before releasing it (controlplane.tenancy.admission).
        try:
            with admission.tenant_admission(self.store, dep.tenant, wait_s=ADMISSION_WAIT_S) as guard:
                refusal = quotas.check_deployment_change(self.store, dep.name, dep.tenant, dep.profile,
                                                         dep.replicas, decision.replicas)
                if refusal is not None:
                    return False  # another change took the room: the next tick decides a quota hold
                admission.still_held(guard)
                return self._cas(dep, mod_revision, decision, now)
        except TransientError as exc:
            log.info("deployment %s: scale-out deferred: %s", dep.name, exc)
            return False

    def _cas(self, dep: InferenceDeployment, mod_revision: int, decision: Decision, now: float) -> bool:
        note = "" if decision.code == "disabled" else decision.summary

        def decided(record: InferenceDeployment) -> InferenceDeployment:
            record.status.scaling = note
            record.status.message = with_note(record.status.message, note)
            if decision.action != "hold":
                record.scale_to(decision.replicas, now)
            return record

        return deployments.update_at(self.store, dep.name, mod_revision, decided)
