"""Preempted replicas come back in class order: a deployment gets one back only when it fits
without taking anything and no higher class is short or waiting for its own (preempt_apply.restore,
on a real SQLite store and snapshot)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from common import keyspace
from common.schemas import DeploymentStatus, InferenceDeployment
from common.store.sqlite_store import SqliteStore
from controlplane.orchestration_state import load_snapshot
from controlplane.reconcile import plan as rp
from controlplane.reconcile import preempt_apply
from tests.controlplane.planner_data import NOW, model, node, profile, replica


class Events:
    def __init__(self):
        self.seen = []

    def deployment(self, dep, reason, message, warning=False):
        self.seen.append((dep.name, reason))


def dep(name, cls, replicas, preempted=0):
    return InferenceDeployment(name=name, model="qwen", profile="p24", replicas=replicas, capacity_class=cls,
                               status=DeploymentStatus(phase="Ready", preempted=preempted,
                                                       preempted_by="chat" if preempted else ""))


def setup(tmp_path, deployments, replicas, gpus=2):
    store = SqliteStore(tmp_path / "fabric.db")
    store.put(keyspace.models("qwen"), model().model_dump_json())
    store.put(keyspace.profiles("p24"), profile().model_dump_json())
    store.put(keyspace.nodes("n1"), node("n1", gpus).model_copy(update={"last_heartbeat": NOW}).model_dump_json())
    for d in deployments:
        store.put(keyspace.deployments(d.name), d.model_dump_json())
    for r in replicas:
        store.put(keyspace.replicas(r.deployment, r.replica_id), r.model_dump_json())
    worker = SimpleNamespace(store=store, events=Events(), clock=lambda: NOW, settings=rp.ReconcileSettings())
    return store, worker


def stored(store, name):
    return json.loads(store.get(keyspace.deployments(name)).value)["status"]


def on(d, ordinal, gpu):
    return replica(ordinal).model_copy(update={"replica_id": f"{d}-{ordinal}", "deployment": d,
                                               "gpus": [f"0000:{0x10 + gpu:02x}:00.0"]})


def test_the_higher_class_comes_back_first(tmp_path):
    # One free GPU; a standard and an opportunistic deployment each have one preempted replica.
    deps = [dep("std", "standard", 1, preempted=1), dep("opp", "opportunistic", 1, preempted=1),
            dep("chat", "critical", 1)]
    store, worker = setup(tmp_path, deps, [on("chat", 0, 0)])
    try:
        snap = load_snapshot(store)
        assert preempt_apply.restore(worker, snap, snap.deployments["opp"]).status.preempted == 1  # std first
        back = preempt_apply.restore(worker, snap, snap.deployments["std"])
        assert back.status.preempted == 0 and stored(store, "std")["preempted"] == 0
        assert stored(store, "std")["preempted_by"] == ""
        assert worker.events.seen == [("std", "PreemptedReturning")]
        # With std back (its replica placed), opp returns once room is left: none here.
        store.put(keyspace.replicas("std", "std-0"), on("std", 0, 1).model_dump_json())
        snap = load_snapshot(store)
        assert preempt_apply.restore(worker, snap, snap.deployments["opp"]).status.preempted == 1
    finally:
        store.close()


def test_no_return_while_a_higher_class_is_short(tmp_path):
    # chat wants 2 and has 1: it is short, so opp waits even though a GPU is free.
    deps = [dep("opp", "opportunistic", 1, preempted=1), dep("chat", "critical", 2)]
    store, worker = setup(tmp_path, deps, [on("chat", 0, 0)])
    try:
        snap = load_snapshot(store)
        assert preempt_apply.restore(worker, snap, snap.deployments["opp"]).status.preempted == 1
        assert preempt_apply.short_of(snap, snap.deployments["chat"]) == 1
    finally:
        store.close()


def test_targets_take_off_the_preempted_and_a_scale_in_clamps_them(tmp_path):
    d = dep("opp", "opportunistic", 3, preempted=2)
    assert preempt_apply.targets(d, None) == {1: 1}
    assert preempt_apply.targets(d, {1: 2, 2: 1}) == {1: 2, 2: 1}  # a rollout's counts are its own
    store, worker = setup(tmp_path, [dep("opp", "opportunistic", 1, preempted=2)], [], gpus=0)
    try:
        snap = load_snapshot(store)
        assert preempt_apply.restore(worker, snap, snap.deployments["opp"]).status.preempted == 1
        assert stored(store, "opp")["preempted"] == 1
    finally:
        store.close()


def test_gpus_by_class_on_the_capacity_view_and_the_gauge(tmp_path):
    from controlplane.cluster_metrics import ClusterCollector

    deps = [dep("opp", "opportunistic", 1), dep("chat", "critical", 1)]
    store, _ = setup(tmp_path, deps, [on("chat", 0, 0), on("opp", 0, 1)], gpus=3)
    try:
        fams = {f.name: f for f in ClusterCollector(store).collect()}
        got = {s.labels["capacity_class"]: s.value for s in fams["fabric_gpus_by_class"].samples}
        assert got == {"opportunistic": 1.0, "standard": 0.0, "critical": 1.0}
    finally:
        store.close()
