"""A fully preempted deployment's endpoint answers 503 deployment_preempted (not loading, not held);
one with a replica left or coming is not refused as preempted (gateway.cold_start.refusal)."""

from common.schemas import DeploymentStatus, InferenceDeployment, Replica
from gateway.cold_start import refusal


def dep(phase="Preempted", preempted=2, replicas=2):
    return InferenceDeployment(name="batch", model="m", profile="p", replicas=replicas,
                               capacity_class="opportunistic",
                               status=DeploymentStatus(phase=phase, preempted=preempted, preempted_by="chat"))


def test_fully_preempted_names_the_state_and_who_took_it():
    why = refusal("ep", "batch", dep(), [Replica(replica_id="batch-1-x", deployment="batch", ordinal=1, node="n",
                                                  phase="Draining", draining=True)])
    assert (why.code, why.loading) == ("deployment_preempted", False)
    assert "taken by chat" in why.message and "opportunistic" in why.message


def test_partly_preempted_or_a_replica_coming_is_not_refused_as_preempted():
    starting = Replica(replica_id="batch-0-x", deployment="batch", ordinal=0, node="n", phase="Starting")
    assert refusal("ep", "batch", dep(phase="Progressing", preempted=1), [starting]).code == "model_loading"
    assert refusal("ep", "batch", dep(), [starting]).code == "model_loading"
    # Pending with every replica preempted (the status not rewritten yet) is preempted too.
    assert refusal("ep", "batch", dep(phase="Pending"), []).code == "deployment_preempted"
