"""FABRIC_DRY_RUN's pure plan: synthetic replicas per deployment, scale, drain, delete."""

from __future__ import annotations

import pytest

from common.schemas import DeploymentStatus, InferenceDeployment, InferenceEndpoint
from controlplane.dryrun.plan import NODE, plan, replica_id, synthetic_observation
from controlplane.routing.strategies import plan_routing
from controlplane.settings import dry_run_from_env

NOW = 1000.0


def dep(replicas=3, phase="Pending") -> InferenceDeployment:
    return InferenceDeployment(name="chat", model="m", profile="p", replicas=replicas,
                               status=DeploymentStatus(phase=phase))


def applied(p, replicas):
    keep = [r for r in replicas if r.replica_id not in p.delete]
    return keep + list(p.create)


def test_first_pass_creates_ready_synthetic_replicas_and_reports_dryrun():
    p = plan(dep(3), [], NOW)
    assert [r.replica_id for r in p.create] == [replica_id("chat", o) for o in range(3)]
    assert all(r.ready and r.phase == "Ready" and r.node == NODE and r.host is None and not r.gpus for r in p.create)
    assert p.status["phase"] == "DryRun" and p.status["ready_replicas"] == 3
    assert [o.replica_id for o in p.observe] == [r.replica_id for r in p.create]
    again = plan(dep(3), list(p.create), NOW + 1)
    assert again.create == () and again.delete == ()


def test_scale_down_removes_the_highest_ordinals_and_up_adds_them_back():
    reps = list(plan(dep(3), [], NOW).create)
    down = plan(dep(1), reps, NOW)
    assert down.delete == (replica_id("chat", 1), replica_id("chat", 2))
    assert down.status["ready_replicas"] == 1
    up = plan(dep(2), applied(down, reps), NOW)
    assert [r.ordinal for r in up.create] == [1]


def test_a_drained_replica_goes_after_its_grace_and_is_replaced():
    reps = list(plan(dep(2), [], NOW).create)
    reps[0] = reps[0].model_copy(update={"draining": True, "drain_deadline": NOW + 30, "phase": "Draining"})
    during = plan(dep(2), reps, NOW + 10)
    assert during.delete == () and during.create == () and during.status["ready_replicas"] == 1
    after = plan(dep(2), reps, NOW + 31)
    assert after.delete == (reps[0].replica_id,) and [r.ordinal for r in after.create] == [0]


def test_a_deleted_deployment_loses_its_replicas_then_its_record():
    reps = list(plan(dep(2), [], NOW).create)
    p = plan(dep(2, phase="Deleting"), reps, NOW)
    assert p.delete_deployment and sorted(p.delete) == sorted(r.replica_id for r in reps) and p.create == ()


def test_synthetic_metrics_make_strategies_diverge_and_stay_out_of_maglev():
    reps = list(plan(dep(3), [], NOW).create)
    obs = {r.replica_id: synthetic_observation(r, NOW) for r in reps}
    for routing in ("least_queue", "lowest_ttft", "highest_throughput"):
        ep = InferenceEndpoint(name="chat-openai", deployment="chat", routing=routing)
        routed = plan_routing(ep, reps, obs, {}, NOW)
        weights = [routed.weights[r.replica_id] for r in reps]
        assert weights[0] > weights[1] > weights[2], (routing, weights)
        assert routed.backends == ()  # no address, so nothing for Maglev


@pytest.mark.parametrize("raw,expected", [("", False), ("0", False), ("1", True), ("true", True)])
def test_the_flag(raw, expected):
    assert dry_run_from_env({"FABRIC_DRY_RUN": raw}) is expected


def test_a_bad_flag_names_the_variable():
    with pytest.raises(ValueError, match="FABRIC_DRY_RUN='maybe'"):
        dry_run_from_env({"FABRIC_DRY_RUN": "maybe"})
