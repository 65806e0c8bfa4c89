"""AutoscaleWorker against a real SQLite store: decisions are applied with compare-and-swap,
recorded on the deployment (status.scaling and the tail of status.message) and in the event log
once per change, the memory survives a new worker (a new leader), a quota refusal is recorded,
and a deployment scaled by an operator meanwhile is left alone."""

from __future__ import annotations

import asyncio
import json
import time

from common import keyspace
from common.records.events import recent_events
from common.schemas import (
    AutoscalingSpec,
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    Replica,
    ReplicaObservation,
    TenantQuota,
)
from controlplane.orchestration_state import load_snapshot
from controlplane.scaling.loop import AutoscaleWorker, load_memory, with_note


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def seed(store, *, replicas=1, queue=30.0, tenant=None, gpus=1, spec=None, now=1000.0):
    store.put(keyspace.profiles("p"), InferenceProfile(name="p", gpu={"count": gpus, "vram_gib": 24}, cpu=1,
                                                       memory_gib=1).model_dump_json())
    spec = spec or AutoscalingSpec(min_replicas=1, max_replicas=3, scale_out_queue=20, scale_out_seconds=10,
                                   scale_in_queue=1, scale_in_seconds=10, cooldown_seconds=0)
    dep = InferenceDeployment(name="d", model="m", profile="p", replicas=replicas, tenant=tenant, autoscaling=spec)
    dep.status.message = "1/1 replicas ready"
    store.put(keyspace.deployments("d"), dep.model_dump_json())
    for i in range(replicas):
        rid = f"d-{i}"
        store.put(keyspace.replicas("d", rid), Replica(replica_id=rid, deployment="d", ordinal=i, node="n",
                                                       ready=True, phase="Ready", host="127.0.0.1").model_dump_json())
        observe(store, rid, queue, now)


def observe(store, rid: str, queue: float, at: float) -> None:
    store.put(keyspace.observations(rid), ReplicaObservation(replica_id=rid, scraped_at=at, ok=True,
                                                             queue_depth=queue).model_dump_json())


def dep(store) -> dict:
    return json.loads(store.get(keyspace.deployments("d")).value)


def run(worker):
    asyncio.run(worker.tick())


def test_queue_held_scales_out_once_and_says_why(store):
    clock = Clock()
    seed(store, queue=30)
    run(AutoscaleWorker(store, clock=clock))
    d = dep(store)
    assert d["replicas"] == 1 and d["status"]["scaling"].startswith("hold: queue 30 > 20 for 0s of 10s")
    assert d["status"]["message"] == "1/1 replicas ready; autoscaler: " + d["status"]["scaling"]
    clock.t += 11
    observe(store, "d-0", 30, clock.t)
    run(AutoscaleWorker(store, clock=clock))  # a new worker (a new leader) continues the timer
    d = dep(store)
    assert d["replicas"] == 2
    assert d["status"]["scaling"] == "scale out to 2: queue 30 > 20 for 11s (>= 10s)"
    assert load_memory(store, "d").last_action == "scale_out"
    reasons = [e.reason for e in recent_events(store, kind="deployment", name="d")]
    assert reasons == ["ScalingHeld", "ScaledOut"]
    clock.t += 1
    run(AutoscaleWorker(store, clock=clock))  # the new replica is not ready yet: a new decision, recorded
    assert dep(store)["status"]["scaling"].startswith("hold: 1/2 replicas ready")
    # Ticks that decide the same thing again write nothing and record nothing.
    revision = store.get(keyspace.deployments("d")).mod_revision
    clock.t += 5
    run(AutoscaleWorker(store, clock=clock))
    run(AutoscaleWorker(store, clock=clock))
    assert store.get(keyspace.deployments("d")).mod_revision == revision
    assert [e.reason for e in recent_events(store, kind="deployment", name="d")] == reasons + ["ScalingHeld"]


def test_quota_refusal_is_recorded_on_the_deployment(store):
    clock = Clock()
    seed(store, queue=30, tenant="acme", gpus=2)
    store.put(keyspace.quotas("acme"), TenantQuota(tenant="acme", max_gpus=3).model_dump_json())
    worker = AutoscaleWorker(store, clock=clock)
    run(worker)
    clock.t += 11
    observe(store, "d-0", 30, clock.t)
    run(worker)
    d = dep(store)
    assert d["replicas"] == 1
    assert "tenant 'acme' GPU quota is 3 (max_gpus); it uses 2 and this needs 2 more" in d["status"]["message"]
    refusals = [e for e in recent_events(store, name="d") if e.reason == "QuotaRefused"]
    assert len(refusals) == 1 and refusals[0].type == "Warning"


def test_an_operator_scale_meanwhile_wins(store):
    clock = Clock()
    seed(store, queue=30, spec=AutoscalingSpec(scale_out_queue=20, scale_out_seconds=0, scale_in_queue=1,
                                               cooldown_seconds=0))
    worker = AutoscaleWorker(store, clock=clock)
    snap = load_snapshot(store)
    record = dep(store)
    record["replicas"] = 3  # the operator's scale lands between the snapshot and the write
    store.put(keyspace.deployments("d"), json.dumps(record))
    decision = worker.apply(snap, snap.deployments["d"], snap.deployment_revisions["d"])
    assert decision.action == "scale_out" and decision.replicas == 2
    assert dep(store)["replicas"] == 3


def test_a_scale_out_rechecks_the_quota_fresh_under_the_tenant_lock(store):
    """A deployment of the same tenant created after the snapshot took the room: the decision
    (made from the snapshot) says scale out, but the write re-checks on fresh reads and refuses."""
    seed(store, queue=30, tenant="acme", spec=AutoscalingSpec(scale_out_queue=20, scale_out_seconds=0,
                                                              scale_in_queue=1, cooldown_seconds=0))
    store.put(keyspace.quotas("acme"), TenantQuota(tenant="acme", max_gpus=2).model_dump_json())
    worker = AutoscaleWorker(store, clock=Clock())
    snap = load_snapshot(store)
    other = InferenceDeployment(name="other", model="m", profile="p", replicas=1, tenant="acme")
    store.put(keyspace.deployments("other"), other.model_dump_json())
    decision = worker.apply(snap, snap.deployments["d"], snap.deployment_revisions["d"])
    assert decision.action == "scale_out" and decision.replicas == 2
    assert dep(store)["replicas"] == 1  # 1 + 1 held already; a second replica of d would be 3 > 2


def test_a_scale_out_waits_for_a_busy_tenant_and_defers(store, monkeypatch):
    from common.store.locks import LeaseLock
    from controlplane.scaling import loop
    from controlplane.tenancy import admission

    monkeypatch.setattr(loop, "ADMISSION_WAIT_S", 0.1)
    seed(store, queue=30, tenant="acme", spec=AutoscalingSpec(scale_out_queue=20, scale_out_seconds=0,
                                                              scale_in_queue=1, cooldown_seconds=0))
    store.put(keyspace.quotas("acme"), TenantQuota(tenant="acme", max_gpus=8).model_dump_json())
    busy = LeaseLock(store, admission.lock_name("acme"), holder="api-create", ttl=30)
    assert busy.try_acquire()
    worker = AutoscaleWorker(store, clock=Clock())
    snap = load_snapshot(store)
    worker.apply(snap, snap.deployments["d"], snap.deployment_revisions["d"])
    assert dep(store)["replicas"] == 1  # not written while another admission holds the tenant
    busy.release()
    snap = load_snapshot(store)
    worker.apply(snap, snap.deployments["d"], snap.deployment_revisions["d"])
    assert dep(store)["replicas"] == 2
    assert store.get(keyspace.locks(admission.lock_name("acme"))) is None  # released after the write


def test_idle_scales_to_zero_and_demand_wakes_it(store):
    clock = Clock()
    spec = AutoscalingSpec(min_replicas=1, max_replicas=2, scale_out_queue=20, scale_in_queue=1, scale_in_seconds=5,
                           scale_to_zero=True, scale_to_zero_idle_seconds=5, cooldown_seconds=0)
    seed(store, queue=0, spec=spec)
    store.put(keyspace.endpoints("e"), InferenceEndpoint(name="e", deployment="d").model_dump_json())
    worker = AutoscaleWorker(store, clock=clock)
    run(worker)
    clock.t += 6
    observe(store, "d-0", 0, clock.t)
    run(worker)
    assert dep(store)["replicas"] == 0
    store.delete(keyspace.replicas("d", "d-0"))
    run(worker)
    assert dep(store)["status"]["scaling"].startswith("hold: scaled to zero")
    clock.t += 1
    store.put(keyspace.demand("e"), json.dumps({"at": clock.t}))  # what the gateway writes
    run(worker)
    d = dep(store)
    assert d["replicas"] == 1 and "a call arrived with 0 replicas" in d["status"]["scaling"]


def test_a_call_from_before_an_operator_scaled_to_zero_wakes_nothing(store, tmp_path):
    """The gateway recorded demand while the deployment served (a call held for a new endpoint's
    first plan); autoscaling is enabled later and the operator scales to zero: the autoscaler,
    which never acted on it, must not read that old call as one waiting now. A call after wakes it."""
    from controlplane.ops.deployments import ScaleRequest, scale
    from controlplane.state import AppState

    clock = Clock(time.time())
    spec = AutoscalingSpec(min_replicas=0, max_replicas=2, scale_to_zero=True, cooldown_seconds=0)
    seed(store, queue=0, spec=spec, now=clock.t)
    store.put(keyspace.endpoints("e"), InferenceEndpoint(name="e", deployment="d").model_dump_json())
    store.put(keyspace.demand("e"), json.dumps({"at": clock.t - 60}))  # what the gateway wrote then
    scale(AppState(store=store, state_dir=tmp_path), None, "d", ScaleRequest(replicas=0))
    assert dep(store)["status"]["scaled_at"] >= clock.t - 60
    store.delete(keyspace.replicas("d", "d-0"))
    worker = AutoscaleWorker(store, clock=clock)
    run(worker)
    d = dep(store)
    assert d["replicas"] == 0 and d["status"]["scaling"].startswith("hold: scaled to zero"), d["status"]
    clock.t = time.time() + 1
    store.put(keyspace.demand("e"), json.dumps({"at": clock.t}))
    run(worker)
    d = dep(store)
    assert d["replicas"] == 1 and "a call arrived with 0 replicas" in d["status"]["scaling"]
    assert d["status"]["scaled_at"] == clock.t  # the autoscaler's change is dated too


def test_with_note_replaces_the_previous_note():
    assert with_note("2/2 ready", "hold: steady") == "2/2 ready; autoscaler: hold: steady"
    assert with_note("2/2 ready; autoscaler: hold: steady", "scale in to 1: idle") == \
        "2/2 ready; autoscaler: scale in to 1: idle"
    assert with_note("2/2 ready; autoscaler: hold: steady", "") == "2/2 ready"
