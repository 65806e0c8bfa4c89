"""Drain: scale-in picks the replica with the least work; a draining replica goes once its engine
reports nothing in flight after its weight 0 settled, or when the grace ends; deleting a
deployment drains the same way. Plus: a stored profile whose runtime is denied later still loads,
and its deployment is Failed with the reason (real SQLite store, real ReconcileWorker)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from common import keyspace
from common.schemas import ReplicaObservation
from common.store.sqlite_store import SqliteStore
from controlplane.orchestration_state import load_snapshot
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from controlplane.settings import load
from tests.controlplane.planner_data import NOW, deployment, model, node, profile, replica
from tests.support.fake_agents import FakeAgents

OK = {f"qwen-{i}-abc": rp.Probe(True) for i in range(4)}
SETTINGS = rp.ReconcileSettings(drain_grace_s=30, drain_settle_s=11)


def obs(rid, running, waiting=0.0, at=NOW - 1, ok=True):
    return ReplicaObservation(replica_id=rid, scraped_at=at, ok=ok, running=running, queue_depth=waiting)


def drains(p):
    return [a for a in p.actions if isinstance(a, rp.StartDrain)]


def test_scale_in_drains_the_replica_with_the_least_work():
    reps = [replica(0), replica(1), replica(2)]
    work = rp.replica_work(reps, {"qwen-0-abc": obs("qwen-0-abc", 1), "qwen-1-abc": obs("qwen-1-abc", 5, 3),
                                  "qwen-2-abc": obs("qwen-2-abc", 4)}, NOW)
    assert work == {"qwen-0-abc": 1, "qwen-1-abc": 8, "qwen-2-abc": 4}
    p = rp.plan(deployment(2), profile(), model(), reps, [node("n1", 4)], OK, NOW, settings=SETTINGS, work=work)
    assert [(a.replica_id, a.reason) for a in drains(p)] == [("qwen-0-abc", "scale down to 2; least work (1 requests)")]


def test_unknown_work_counts_as_most_and_stale_scrapes_are_unknown():
    reps = [replica(0), replica(1)]
    work = rp.replica_work(reps, {"qwen-1-abc": obs("qwen-1-abc", 9, at=NOW - 31),
                                  "qwen-0-abc": obs("qwen-0-abc", 6)}, NOW)
    assert work == {"qwen-0-abc": 6}
    p = rp.plan(deployment(1), profile(), model(), reps, [node("n1", 4)], OK, NOW, settings=SETTINGS, work=work)
    assert [a.replica_id for a in drains(p)] == ["qwen-0-abc"]


def test_a_drained_replica_goes_when_idle_after_its_weight_settled():
    r = replica(1, draining=True, deadline=NOW + 25, phase="Draining").model_copy(update={"drain_started": NOW - 15})
    early = r.model_copy(update={"drain_started": NOW - 5})
    obs_idle = {"qwen-1-abc": obs("qwen-1-abc", 0)}
    assert rp.drained_replicas([r], obs_idle, NOW, 11) == {"qwen-1-abc"}
    assert rp.drained_replicas([early], obs_idle, NOW, 11) == set()  # scraped before weight 0 settled
    assert rp.drained_replicas([r], {"qwen-1-abc": obs("qwen-1-abc", 1)}, NOW, 11) == set()  # still running
    assert rp.drained_replicas([r], {"qwen-1-abc": obs("qwen-1-abc", 0, ok=False)}, NOW, 11) == set()
    p = rp.plan(deployment(1), profile(), model(), [replica(0), r], [node("n1", 4)], OK, NOW, settings=SETTINGS,
                drained={"qwen-1-abc"})
    deletes = [a for a in p.actions if isinstance(a, rp.DeleteReplica)]
    assert deletes == [rp.DeleteReplica("qwen-1-abc", "drained: no requests running or waiting")]
    p = rp.plan(deployment(1), profile(), model(), [replica(0), r], [node("n1", 4)], OK, NOW, settings=SETTINGS)
    assert not [a for a in p.actions if isinstance(a, rp.DeleteReplica)]  # busy: waits for the grace


def test_deleting_a_deployment_drains_ready_replicas_and_removes_the_rest():
    ready, starting = replica(0), replica(1, ready=False)
    done = replica(2, draining=True, deadline=NOW - 1, phase="Draining")
    waiting = replica(3, draining=True, deadline=NOW + 10, phase="Draining")
    actions = rp.plan_deletion([ready, starting, done, waiting], {"qwen-0-abc"}, NOW, 30)
    assert actions == [
        rp.StartDrain("qwen-0-abc", NOW + 30, "deployment deleted"),
        rp.DeleteReplica("qwen-1-abc", "deployment deleted; it was not ready"),
        rp.DeleteReplica("qwen-2-abc", "deployment deleted; drain grace elapsed"),
    ]
    assert rp.plan_deletion([waiting], set(), NOW, 30, drained={"qwen-3-abc"}) == [
        rp.DeleteReplica("qwen-3-abc", "deployment deleted; drained: no requests running or waiting")]


def no_agent(pool):
    raise AssertionError("no agent call expected")


@pytest.mark.parametrize("deny, why", [
    ("triton", "runtime triton is denied by FABRIC_DENY_RUNTIMES"),
    ("", "runtime triton cannot serve an OpenAI endpoint: tritonserver serves the KServe v2 API"),
])
def test_a_refused_runtime_loads_and_fails_its_deployment(tmp_path, deny, why):
    store = SqliteStore(tmp_path / "fabric.db")
    try:
        store.put(keyspace.models("qwen"), model().model_dump_json())
        # Accepted while triton was allowed; stored as it was.
        store.put(keyspace.profiles("p24"), profile().model_copy(update={"runtime": "triton"}).model_dump_json())
        store.put(keyspace.deployments("qwen"), deployment(2).model_dump_json())
        store.put(keyspace.nodes("n1"), node("n1", 4).model_copy(update={"last_heartbeat": 4e9}).model_dump_json())
        snap = load_snapshot(store)
        assert snap.profiles["p24"].runtime == "triton"  # not vanished
        # fabricd's FABRIC_DENY_RUNTIMES reaches the reconciler through its settings; with none, a
        # runtime without an OpenAI API (refused at the API since) still starts nothing
        denied = dataclasses.replace(SETTINGS, deny_runtimes=load({"FABRIC_DENY_RUNTIMES": deny}).deny_runtimes)
        worker = ReconcileWorker(store, FakeAgents(no_agent), denied)
        asyncio.run(worker.tick())
        asyncio.run(worker.aclose())
        status = json.loads(store.get(keyspace.deployments("qwen")).value)["status"]
        assert status["phase"] == "Failed" and status["message"].startswith(why), status["message"]
        assert store.list(keyspace.replicas()) == []
    finally:
        store.close()
