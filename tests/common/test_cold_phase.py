"""common.cold_phase: the cold start's phase from the records alone (the gateway's held calls and
fabricd's explain routing both show it)."""

from __future__ import annotations

import pytest

from common.cold_phase import PHASES, cold_phase
from common.schemas import InferenceDeployment, Replica


def dep(replicas: int) -> InferenceDeployment:
    return InferenceDeployment(name="d", model="m", profile="p", replicas=replicas)


def rep(phase: str, host: str | None = None, ready: bool = False, message: str = "", draining: bool = False):
    return Replica(replica_id="r", deployment="d", ordinal=0, node="n1", host=host, phase=phase, ready=ready,
                   message=message, draining=draining)


@pytest.mark.parametrize("deployment,replicas,phase,detail", [
    (dep(0), [], "wake", "autoscaler"),
    (None, [], "wake", "autoscaler"),
    (dep(1), [], "placement", "choosing a node"),
    (dep(1), [rep("Pending", message="waiting: model job fetch running")], "model_files", "model job"),
    (dep(1), [rep("Starting", host="10.0.0.2", message="VM running on n1; waiting for /health")], "health",
     "/health"),
    (dep(1), [rep("Ready", host="10.0.0.2", ready=True)], "first_token", "ready"),
    (dep(1), [rep("Ready", host="10.0.0.2", ready=True, draining=True)], "placement", "choosing a node"),
])
def test_the_furthest_phase_a_live_replica_reached(deployment, replicas, phase, detail):
    got = cold_phase(deployment, replicas)
    assert got.phase == phase and got.phase in PHASES and detail in got.detail
