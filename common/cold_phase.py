"""Where a cold start stands: the one function the gateway (a held call's explanation) and
fabricd (explain routing on the endpoint) both call, so they cannot say different things.

From the first call at zero replicas to its first token, a deployment passes these phases, each
read from the records alone:
  wake         the deployment wants no replica yet: the call's demand is recorded, the
               autoscaler has not acted on it
  placement    replicas are wanted, none exists yet: the scheduler is choosing a node
  model_files  a replica is placed (Pending): its node fetches and checks the model's files
               before it starts the engine (the replica's message says what it waits for)
  health       the engine is started (Starting, an address): waiting for its /health
  first_token  a replica is Ready: a held call is on its way to it
A GPU VM's own steps (VM create, firmware, guest kernel, driver, weights load, graph capture)
fall in model_files and health: docs/autoscaling.md lists what the agent and guest report of each.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.schemas import InferenceDeployment, Replica

PHASES = ("wake", "placement", "model_files", "health", "first_token")


@dataclass(frozen=True)
class ColdPhase:
    phase: str  # one of PHASES
    detail: str  # the replica's own message, or what the phase waits for

    def as_dict(self) -> dict:
        return {"phase": self.phase, "detail": self.detail}


def cold_phase(dep: InferenceDeployment | None, replicas: list[Replica]) -> ColdPhase:
    """Pure: the furthest phase any live replica of ``dep`` reached."""
    live = [r for r in replicas if not r.draining and r.phase in ("Pending", "Starting", "Ready", "Unhealthy")]
    if any(r.ready for r in live):
        return ColdPhase("first_token", "a replica is ready")
    starting = [r for r in live if r.phase in ("Starting", "Unhealthy") and r.host]
    if starting:
        return ColdPhase("health", starting[0].message or "waiting for the engine's /health")
    if live:
        return ColdPhase("model_files", live[0].message or "the node prepares the model's files")
    if dep is not None and dep.replicas > 0:
        return ColdPhase("placement", "choosing a node for a replica")
    return ColdPhase("wake", "the demand is recorded; the autoscaler scales the deployment up")
