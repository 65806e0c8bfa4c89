"""What fabricd does for a deployment under FABRIC_DRY_RUN=1, as a pure plan.

With no agent, no GPU and no BPF, the reconciler is replaced by this one: each deployment gets
``replicas`` synthetic replica records (node ``dry-run``, no address, no GPU) that are Ready at
once, each with a synthetic metrics observation so the routing controller gives them weights
like real engines (they differ per ordinal, so strategies visibly diverge). The deployment's
phase is ``DryRun``. Endpoints then take a VIP as usual; their replicas have no IP address, so
the routing controller leaves Maglev out (there is no agent to push to either). Scaling down
removes the highest ordinals, a drain removes a replica once its grace ends, and a deleted
deployment loses its replicas and then its record.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.schemas import InferenceDeployment, Replica, ReplicaObservation

NODE = "dry-run"
MESSAGE = "synthetic replica (FABRIC_DRY_RUN=1: no agent, no GPU, no VM)"


@dataclass(frozen=True)
class DryRunPlan:
    deployment: str
    create: tuple[Replica, ...] = ()
    delete: tuple[str, ...] = ()  # replica ids
    observe: tuple[ReplicaObservation, ...] = ()
    status: dict | None = None  # the deployment's new status fields
    delete_deployment: bool = False


def replica_id(deployment: str, ordinal: int) -> str:
    return f"{deployment}-{ordinal}-dry"


def synthetic_observation(replica: Replica, now: float) -> ReplicaObservation:
    """Readings that differ by ordinal: a later ordinal looks busier and slower."""
    k = replica.ordinal
    return ReplicaObservation(replica_id=replica.replica_id, scraped_at=now, ok=True, queue_depth=float(k),
                              running=float(1 + k % 4), kv_cache_usage=min(0.9, 0.1 + 0.15 * k),
                              ttft_p50_s=0.05 * (1 + k), tokens_per_s=400.0 / (1 + k), failure_ratio=0.0)


def plan(dep: InferenceDeployment, replicas: list[Replica], now: float) -> DryRunPlan:
    if dep.status.phase == "Deleting":
        return DryRunPlan(dep.name, delete=tuple(sorted(r.replica_id for r in replicas)), delete_deployment=True)
    gone = sorted(r.replica_id for r in replicas
                  if r.ordinal >= dep.replicas or (r.draining and (r.drain_deadline or 0) <= now))
    keep = [r for r in replicas if r.replica_id not in gone]
    have = {r.ordinal for r in keep}
    # A replica being drained keeps its ordinal until it goes; its replacement waits for that.
    create = tuple(
        Replica(replica_id=replica_id(dep.name, o), deployment=dep.name, ordinal=o, revision=dep.revision, node=NODE,
                phase="Ready", ready=True, message=MESSAGE, created_at=now)
        for o in range(dep.replicas) if o not in have)
    live = [r for r in keep if not r.draining] + list(create)
    observe = tuple(synthetic_observation(r, now) for r in sorted(live, key=lambda r: r.ordinal))
    status = {"phase": "DryRun", "ready_replicas": len(live), "replicas": len(keep) + len(create),
              "message": f"dry run: {len(live)}/{dep.replicas} synthetic replicas (FABRIC_DRY_RUN=1, no agent)"}
    return DryRunPlan(dep.name, create=create, delete=tuple(gone), observe=observe, status=status)
