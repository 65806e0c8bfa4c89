"""What the reconciler records in the event log (common.records.events), one event per change.

Replica events are on object ``replica/{replica_id}`` (the VM has the same name), so
GET /api/ai/explain/failure/{replica} reads a replica's whole history from them: created (with
the placement reason), Ready, each failed probe, start timeout, replaced, drain started,
deleted, and every agent error with its backoff. Deployment events carry placement decisions
and deletion. Nothing here is recorded per tick: a booting replica's "waiting for /health"
and an agent still in backoff (the agent is not called) record nothing.
"""

from __future__ import annotations

from common.errors import TransientError
from common.records.events import EventSink
from common.schemas import InferenceDeployment, Replica
from controlplane.reconcile import plan as rp


class ReconcileEvents:
    def __init__(self, sink: EventSink):
        self.sink = sink

    def _record(self, kind: str, name: str, reason: str, message: str, tenant: str | None, warning: bool) -> None:
        self.sink(kind, name, reason, message, tenant=tenant, warning=warning)

    def replica(self, dep: InferenceDeployment, replica_id: str, reason: str, message: str, *,
                warning: bool = False) -> None:
        self._record("replica", replica_id, reason, f"{dep.name}: {message}", dep.tenant, warning)

    def deployment(self, dep: InferenceDeployment, reason: str, message: str, *, warning: bool = False) -> None:
        self._record("deployment", dep.name, reason, message, dep.tenant, warning)

    def placed(self, dep: InferenceDeployment, replica: Replica, reason: str) -> None:
        gpus = ",".join(replica.gpus) or "no GPU"
        self.deployment(dep, "Placed", f"replica {replica.replica_id} (ordinal {replica.ordinal}) on "
                        f"{replica.node} [{gpus}]: {reason}")
        self.replica(dep, replica.replica_id, "ReplicaCreated", f"on {replica.node} [{gpus}]: {reason}")

    def health(self, dep: InferenceDeployment, before: Replica | None, action: rp.UpdateHealth) -> None:
        """Ready on the transition to Ready; each failed probe of a ready replica."""
        if before is None:
            return
        if action.phase == "Ready" and before.phase != "Ready":
            self.replica(dep, action.replica_id, "ReplicaReady", "health answers; it takes traffic")
        elif action.health_failures > before.health_failures:
            self.replica(dep, action.replica_id, "ProbeFailed", action.message, warning=True)

    def agent_error(self, dep: InferenceDeployment, replica_id: str, node: str, exc: TransientError,
                    doing: str) -> None:
        """An agent call that failed (not one skipped while the node waits out its backoff)."""
        if exc.code == "agent_backoff":
            return
        self.replica(dep, replica_id, "AgentError", f"{doing} on {node}: {exc.message}", warning=True)
        self._record("node", node, "AgentError", exc.message, None, True)

    def teardown_error(self, r: Replica, node: str, exc: TransientError) -> None:
        if exc.code == "agent_backoff":
            return
        self._record("replica", r.replica_id, "AgentError", f"{r.deployment}: removing it on {node}: {exc.message}",
                     None, True)
        self._record("node", node, "AgentError", exc.message, None, True)
