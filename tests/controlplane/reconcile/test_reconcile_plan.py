"""The reconcile plan for one deployment (pure, table-driven)."""

import pytest

from controlplane.placement.scheduler import Committed
from controlplane.reconcile.plan import (
    CreateReplica,
    DeleteReplica,
    Probe,
    ReconcileSettings,
    SetStatus,
    StartDrain,
    UpdateHealth,
    first_unused_ordinals,
    plan,
)
from tests.controlplane.planner_data import NOW, deployment, model, node, profile, replica

OK, BAD = Probe(True), Probe(False, "connection refused")


def kinds(p, kind):
    return [a for a in p.actions if isinstance(a, kind)]


def run(replicas=(), nodes=None, probes=None, *, dep=None, prof="default", mdl="default", reservations=None,
        settings=None):
    return plan(dep or deployment(3), profile() if prof == "default" else prof,
                model() if mdl == "default" else mdl, list(replicas),
                nodes if nodes is not None else [node("n1", 4), node("n2", 4)],
                probes or {}, NOW, reservations=reservations, settings=settings or ReconcileSettings())


def test_missing_model_or_profile_fails_with_its_name():
    p = run(mdl=None)
    assert p.status.phase == "Failed" and "model 'qwen' does not exist" in p.status.message
    assert not kinds(p, CreateReplica)
    p = run(prof=None)
    assert p.status.phase == "Failed" and "profile 'p24'" in p.status.message


def test_scale_up_from_zero_uses_ordinals_and_accumulates_reservations():
    p = run(nodes=[node("n1", 2)])
    creates = kinds(p, CreateReplica)
    assert [c.ordinal for c in creates] == [0, 1]
    assert sorted(g for c in creates for g in c.gpus) == ["0000:10:00.0", "0000:11:00.0"]
    assert p.status.phase == "Pending" and "no node can take a replica" in p.status.message


def test_new_replica_takes_first_unused_ordinal():
    p = run([replica(0), replica(2)], probes={"qwen-0-abc": OK, "qwen-2-abc": OK})
    assert [c.ordinal for c in kinds(p, CreateReplica)] == [1]
    assert first_unused_ordinals({0, 2, 3}, 3) == [1, 4, 5]


def test_ready_after_health_answers():
    p = run([replica(0, ready=False)], dep=deployment(1), probes={"qwen-0-abc": OK})
    assert kinds(p, UpdateHealth) == [UpdateHealth("qwen-0-abc", True, 0, "Ready", "health answers", NOW)]
    assert p.status == SetStatus("Ready", "1/1 replicas ready", 1, 1)


def test_two_failures_keep_ready_third_replaces():
    p = run([replica(0, failures=1)], dep=deployment(1), probes={"qwen-0-abc": BAD})
    (upd,) = kinds(p, UpdateHealth)
    assert upd.health_failures == 2 and upd.ready and upd.phase == "Unhealthy"
    assert not kinds(p, DeleteReplica)
    p = run([replica(0, failures=2)], dep=deployment(1), probes={"qwen-0-abc": BAD})
    (delete,) = kinds(p, DeleteReplica)
    assert "3 times" in delete.reason
    (create,) = kinds(p, CreateReplica)
    assert create.ordinal == 0  # the old one's ordinal is free again


def test_starting_replica_is_replaced_after_start_timeout():
    old = replica(0, ready=False, created=NOW - 1000)
    p = run([old], dep=deployment(1), probes={"qwen-0-abc": BAD}, settings=ReconcileSettings(start_timeout_s=900))
    assert kinds(p, DeleteReplica) and kinds(p, CreateReplica)
    young = replica(0, ready=False, created=NOW - 10)
    p = run([young], dep=deployment(1), probes={"qwen-0-abc": BAD})
    assert not kinds(p, DeleteReplica) and kinds(p, UpdateHealth)[0].phase == "Starting"


def test_booting_replica_is_not_replaced_for_failed_probes_before_its_start_timeout():
    # An engine that is still starting refuses connections; that is not three strikes.
    booting = replica(0, ready=False, failures=2, created=NOW - 10)
    p = run([booting], dep=deployment(1), probes={"qwen-0-abc": BAD})
    assert not kinds(p, DeleteReplica) and not kinds(p, CreateReplica)
    (upd,) = kinds(p, UpdateHealth)
    assert upd.phase == "Starting" and upd.health_failures == 0 and not upd.ready


def test_offline_node_replica_moves_only_when_another_node_can_take_it():
    nodes = [node("n1", 4, age=120), node("n2", 4)]
    p = run([replica(0, "n1")], nodes=nodes, dep=deployment(1), probes={})
    (delete,) = kinds(p, DeleteReplica)
    assert "offline" in delete.reason
    assert kinds(p, CreateReplica)[0].node == "n2"

    full = [node("n1", 4, age=120), node("n2", 4, taints=["maintenance"])]
    p = run([replica(0, "n1")], nodes=full, dep=deployment(1), probes={})
    assert not kinds(p, DeleteReplica) and not kinds(p, CreateReplica)
    assert "kept: no other node can take it" in p.status.message


def test_scale_down_drains_ready_and_deletes_not_ready_first():
    reps = [replica(0), replica(1), replica(2, ready=False)]
    probes = {"qwen-0-abc": OK, "qwen-1-abc": OK, "qwen-2-abc": BAD}
    p = run(reps, dep=deployment(1), probes=probes, settings=ReconcileSettings(drain_grace_s=20))
    assert [d.replica_id for d in kinds(p, DeleteReplica)] == ["qwen-2-abc"]
    assert kinds(p, StartDrain) == [StartDrain("qwen-1-abc", NOW + 20, "scale down to 1")]


def test_drain_deletes_after_grace_only():
    waiting = replica(1, draining=True, deadline=NOW + 5, phase="Draining")
    done = replica(2, draining=True, deadline=NOW - 1, phase="Draining")
    p = run([replica(0), waiting, done], dep=deployment(1), probes={"qwen-0-abc": OK})
    assert [d.replica_id for d in kinds(p, DeleteReplica)] == ["qwen-2-abc"]
    assert not kinds(p, CreateReplica)  # draining replicas keep their ordinals, the live one suffices
    assert p.status.phase == "Ready"


def test_deleting_replica_does_not_count_and_keeps_its_ordinal():
    p = run([replica(0, phase="Deleting", ready=False)], dep=deployment(1), probes={})
    (create,) = kinds(p, CreateReplica)
    assert create.ordinal == 1


def test_scale_to_zero():
    p = run([], dep=deployment(0))
    assert p.status.phase == "Ready" and p.status.message == "scaled to 0 replicas"


def test_progressing_message_counts_ready():
    p = run([replica(0), replica(1, ready=False)], dep=deployment(2), probes={"qwen-0-abc": OK})
    assert p.status.phase == "Progressing" and p.status.message.startswith("1/2 replicas ready")


def test_scale_up_counts_cpu_of_replicas_placed_and_planned():
    # A 12-CPU node with 8 GPUs and a 4-CPU profile: another deployment holds 4 CPUs there already,
    # so two of three fit (each planned one counts before the next is placed).
    nodes = [node("n1", 8, cpu=12)]
    p = plan(deployment(3), profile(cpu=4, mem=1), model(), [], nodes, {}, NOW,
             committed={"n1": Committed(cpu=4, memory_gib=1, replicas=1)})
    assert [a.node for a in kinds(p, CreateReplica)] == ["n1", "n1"]
    assert p.status.phase == "Pending"
    assert "not enough CPU: 0 of 12 free after 3 replicas, needs 4" in p.status.message


@pytest.mark.parametrize("runtime, budget", [("vllm", 600), ("llama.cpp", 300), ("tei", 300), ("tensorrt-llm", 900)])
def test_a_starting_replica_is_replaced_at_its_runtimes_start_budget_capped_by_the_setting(runtime, budget):
    prof = profile().model_copy(update={"runtime": runtime})
    probes = {"qwen-0-abc": BAD}
    inside = run([replica(0, ready=False, created=NOW - budget + 5)], dep=deployment(1), probes=probes, prof=prof)
    assert not kinds(inside, DeleteReplica) and kinds(inside, UpdateHealth)[0].phase == "Starting"
    past = run([replica(0, ready=False, created=NOW - budget - 5)], dep=deployment(1), probes=probes, prof=prof)
    (gone,) = kinds(past, DeleteReplica)
    assert f"not ready after {budget}s" in gone.reason
    # FABRIC_START_TIMEOUT_SECS caps every runtime's budget
    capped = run([replica(0, ready=False, created=NOW - 125)], dep=deployment(1), probes=probes, prof=prof,
                 settings=ReconcileSettings(start_timeout_s=120))
    assert "not ready after 120s" in kinds(capped, DeleteReplica)[0].reason
