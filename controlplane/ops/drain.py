"""Drain operations: a deployment's replicas, a node's, uncordon, and a crash-loop restart.

Draining a replica is one step wherever it is asked: weight 0 in Maglev with its established
flows kept, the gateway stops choosing it, deleted once its engine reports nothing running or
the grace ends (the reconciler acts on the flags written here). Replicas already draining or
being deleted are left as they are, so a second drain is harmless.

  - Deployment drain without a replica scales the deployment to 0 (409 deleting while it is
    being deleted) and drains every replica; with a replica only that one drains (404 naming it)
    and the reconciler replaces it.
  - Node drain sets the node's ``cordoned`` reason (a heartbeat never clears it), so nothing new
    is placed there, then drains each of its replicas; their deployments keep their counts, so
    replacements are placed elsewhere. Uncordon reopens the node; nothing moves back by itself.
  - Restart unparks a CrashLoop (or Backoff) deployment: its failure count goes to 0 and the next
    reconcile pass creates replicas again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.errors import Conflict, NotFound
from common.records import deployments
from common.records import nodes as node_records
from common.records import replicas as replica_records
from common.schemas import InferenceDeployment, Node
from controlplane.ops import common
from controlplane.orchestration_state import update_deployment_status
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


@dataclass(frozen=True)
class Drained:
    replicas: list[str]  # the replicas this call started draining
    delete_after: float  # unix time the last of them is deleted at the latest


def _drain_replica(ctx: AppState, deployment: str, replica_id: str, grace_secs: float, deadline: float,
                   message: str) -> bool:
    """Mark one replica draining; False when it is gone or already draining."""
    current = replica_records.get(ctx.store, deployment, replica_id)
    if current is None or current.draining or current.phase == "Deleting":
        return False
    replica_records.put(ctx.store, current.model_copy(update={
        "draining": True, "drain_deadline": deadline, "drain_started": time.time(), "phase": "Draining",
        "message": message}))
    return True


def drain_deployment(ctx: AppState, caller: Principal | None, name: str, grace_secs: float,
                     replica: str | None = None) -> Drained:
    if not deployments.exists(ctx.store, name):
        raise NotFound(f"deployment {name!r} not found")
    deadline = time.time() + grace_secs
    if replica is None:
        def scale_to_zero(dep: InferenceDeployment) -> InferenceDeployment:
            if dep.status.phase == "Deleting":
                raise Conflict(f"deployment {name!r} is being deleted", code="deleting")
            dep.scale_to(0, time.time())
            dep.status.message = f"draining all replicas for {grace_secs:g}s"
            return dep

        deployments.update(ctx.store, name, scale_to_zero,
                           busy=f"deployment {name!r} changed too often while draining; try again")
    targets = [r for r in replica_records.list(ctx.store, name) if replica in (None, r.replica_id)]
    if replica is not None and not targets:
        raise NotFound(f"replica {replica!r} of deployment {name!r} not found")
    drained = [r.replica_id for r in targets if not r.draining and r.phase != "Deleting"
               and _drain_replica(ctx, name, r.replica_id, grace_secs, deadline,
                                  f"drained by operator, {grace_secs:g}s grace")]
    return Drained(drained, deadline)


def drain_node(ctx: AppState, caller: Principal | None, node_id: str, grace_secs: float,
               reason: str) -> tuple[Node, Drained]:
    def cordon(node: Node) -> Node:
        node.cordoned = reason
        return node

    node = node_records.update(ctx.store, node_id, cordon)  # NotFound naming the node when absent
    deadline = time.time() + grace_secs
    drained = sorted(r.replica_id for r in replica_records.list(ctx.store)
                     if r.node == node_id and not r.draining and r.phase != "Deleting"
                     and _drain_replica(ctx, r.deployment, r.replica_id, grace_secs, deadline,
                                        f"node {node_id} drained: {reason}, {grace_secs:g}s grace"))
    common.event(ctx, "node", node_id, "NodeDrained",
                 f"node {node_id} cordoned ({reason}); {len(drained)} replicas draining, {grace_secs:g}s grace")
    return node, Drained(drained, deadline)


def uncordon_node(ctx: AppState, caller: Principal | None, node_id: str) -> Node:
    if node_records.get(ctx.store, node_id) is None:
        raise NotFound(f"node {node_id!r} not found")

    def reopen(node: Node) -> Node | None:
        if not node.cordoned:
            return None  # already open: nothing written
        node.cordoned = ""
        return node

    node = node_records.update(ctx.store, node_id, reopen)
    common.event(ctx, "node", node_id, "NodeUncordoned", f"node {node_id} takes new replicas again")
    return node


def restart(ctx: AppState, caller: Principal | None, name: str) -> dict:
    """The deployment's status before the restart (phase, failures, last_failure)."""
    record = deployments.stored(ctx.store, name)
    if record is None:
        raise NotFound(f"deployment {name!r} not found")
    before = record.get("status", {})
    if before.get("phase") == "Deleting":
        raise Conflict(f"deployment {name!r} is being deleted", code="deleting")
    status = {"failures": 0, "last_failure_at": None}
    if before.get("phase") in ("CrashLoop", "Backoff"):
        status.update(phase="Pending", message=f"restarted by an operator after {before.get('failures', 0)} "
                      f"replica failures (last: {before.get('last_failure') or 'none'})")
    update_deployment_status(ctx.store, name, **status)
    common.event(ctx, "deployment", name, "Restarted", f"crash-loop count reset (was {before.get('failures', 0)})",
                 tenant=record.get("tenant"))
    return before
