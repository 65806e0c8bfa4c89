"""The reconcile plan with per-revision targets (what a rollout record asks for)."""

from common.schemas import InferenceProfile
from controlplane.reconcile.plan import CreateReplica, DeleteReplica, Probe, StartDrain, UpdateHealth, plan
from tests.controlplane.planner_data import NOW, deployment, model, node, profile, replica

OK = Probe(True)
BIG = InferenceProfile(name="p48", gpu={"count": 1, "vram_gib": 48}, cpu=8, memory_gib=32)


def of(rev, r):
    return r.model_copy(update={"revision": rev})


def run(replicas, targets, templates=None, nodes=None):
    probes = {r.replica_id: OK for r in replicas if r.ready}
    return plan(deployment(3), profile(), model(), replicas, nodes or [node("n1", 4), node("n2", 4)], probes, NOW,
                targets=targets, templates=templates)


def test_new_revision_replicas_are_created_with_their_revision_and_template():
    p = run([replica(0), replica(1), replica(2)], {1: 3, 2: 1}, {2: (BIG, model())},
            nodes=[node("n1", 4), node("n2", 4, gpus=None)])
    creates = [a for a in p.actions if isinstance(a, CreateReplica)]
    assert [(c.ordinal, c.revision) for c in creates] == [(3, 2)]
    assert p.status.replicas == 4 and p.status.phase == "Progressing"


def test_old_revision_above_its_target_drains_not_ready_first():
    reps = [replica(0), replica(1, ready=False), replica(2), of(2, replica(3))]
    p = run(reps, {1: 1, 2: 1})
    drains = [a.replica_id for a in p.actions if isinstance(a, StartDrain)]
    deletes = [a.replica_id for a in p.actions if isinstance(a, DeleteReplica)]
    assert deletes == ["qwen-1-abc"] and drains == ["qwen-2-abc"]
    assert "revision 1 scales down to 1" in next(a.reason for a in p.actions if isinstance(a, StartDrain))


def test_a_revision_without_a_target_goes_away():
    p = run([replica(0), of(2, replica(1))], {1: 1})
    assert [a.replica_id for a in p.actions if isinstance(a, StartDrain)] == ["qwen-1-abc"]


def test_a_revision_whose_template_is_missing_waits():
    p = run([replica(0)], {1: 1, 3: 1})
    assert not [a for a in p.actions if isinstance(a, CreateReplica)]
    assert "revision 3's model or profile does not exist" in p.status.message


def test_ready_since_is_set_once():
    p = run([replica(0, ready=False)], {1: 1})
    fresh = plan(deployment(1), profile(), model(), [replica(0, ready=False)], [node("n1")],
                 {"qwen-0-abc": OK}, NOW)
    assert [a.ready_since for a in fresh.actions if isinstance(a, UpdateHealth)] == [NOW]
    assert not [a for a in p.actions if isinstance(a, UpdateHealth) and a.ready_since]


def test_each_replica_commits_its_own_revisions_profile():
    from common.rollouts import Revision
    from common.schemas import Template
    from controlplane.orchestration_state import Snapshot

    snap = Snapshot(deployments={"qwen": deployment(2)}, profiles={"p24": profile(cpu=8, mem=32), "p48": BIG},
                    replicas={"qwen": [replica(0), of(2, replica(1))]},
                    revisions={"qwen": {2: Revision(deployment="qwen", revision=2,
                                                    template=Template(model="qwen", profile="p48"))}})
    big = BIG.model_copy(update={"cpu": 16, "memory_gib": 64})
    snap.profiles["p48"] = big
    held = snap.committed()["n1"]
    assert (held.replicas, held.cpu, held.memory_gib) == (2, 8 + 16, 32 + 64)
