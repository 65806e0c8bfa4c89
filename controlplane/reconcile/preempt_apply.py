"""Applies preemption plans inside the reconcile pass; the decisions are controlplane.placement.preemption's.

The reconcile worker calls three hooks per deployment:
  ``restore(worker, snap, dep)``      before planning: a deployment with preempted replicas gets one
                                      back (status.preempted - 1) when a replica of it fits without
                                      taking anything and no deployment of a higher class is short
                                      of replicas or waiting for one of its own to come back, so the
                                      highest class returns first and opportunistic ones last;
  ``targets(dep, targets)``           the replica count the plan aims at: replicas - preempted;
  ``after_plan(worker, snap, dep, plan, errors)``
                                      after the plan was applied: a deployment above opportunistic
                                      still short of replicas asks the planner for one replica; a
                                      "preempt" outcome drains each victim the way every removal
                                      leaves (StartDrain: weight 0, in-flight work finishes within
                                      the drain grace, then deleted) and counts it on its
                                      deployment (status.preempted, preempted_by, an event on the
                                      deployment and a warning on the replica that explain failure
                                      shows). A fully preempted deployment's phase is Preempted.
One preemption per deployment per pass: while victims drain, the next pass finds their room on
its way ("waiting") and takes nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.records import deployments
from common.schemas import InferenceDeployment, Replica
from controlplane.orchestration_state import Snapshot, get_replica, update_deployment_status
from controlplane.placement.index import PlacementIndex
from controlplane.placement.preemption import Preemption, class_rank, holders_from, plan_preemption

PREEMPTED_PHASE = "Preempted"


def _live(replicas: list[Replica]) -> list[Replica]:
    return [r for r in replicas if not r.draining and r.phase not in ("Deleting", "Failed")]


def short_of(snap: Snapshot, dep: InferenceDeployment) -> int:
    """Replicas the deployment wants (less those preempted) and does not have."""
    want = max(0, dep.replicas - dep.status.preempted)
    return max(0, want - len(_live(snap.replicas.get(dep.name, []))))


def snapshot_index(snap: Snapshot, now: float, settings) -> PlacementIndex:
    """The placement index of a snapshot. A replica's own GPUs count as reserved too: a replica
    created earlier in this pass is in the snapshot before its reservations are."""
    reserved = snap.reserved_by_node()
    for r in snap.all_replicas():
        if r.node and r.gpus:
            reserved.setdefault(r.node, set()).update(r.gpus)
    return PlacementIndex(list(snap.nodes.values()), reserved, now, settings, committed=snap.committed(),
                          sites=snap.sites)


def _per_pass(snap: Snapshot, what: str, build):
    """One ``build()`` per pass for every deployment that asks, rebuilt when the pass's snapshot
    gained replicas or reservations (a create earlier in the pass). Kept on the snapshot itself:
    it lives exactly as long as the pass. Callers only read what it returns."""
    memo = snap.__dict__.setdefault("_placement_memo", {})
    sig = (len(snap.reservations), sum(len(v) for v in snap.replicas.values()))
    hit = memo.get(what)
    if hit is None or hit[0] != sig:
        hit = (sig, build())
        memo[what] = hit
    return hit[1]


def index_of(worker, snap: Snapshot) -> PlacementIndex:
    return _per_pass(snap, "index", lambda: snapshot_index(snap, worker.clock(), worker.settings.scheduler))


def holders_of(snap: Snapshot):
    def profile_of(r: Replica):
        dep = snap.deployments.get(r.deployment)
        return None if dep is None else snap.template(dep, r.revision)[0]

    return _per_pass(snap, "holders", lambda: holders_from(snap.all_replicas(), snap.deployments, profile_of,
                                                           snap.guaranteed_gpus, snap.preempt_other_tenants))


def targets(dep: InferenceDeployment, current: Mapping[int, int] | None) -> Mapping[int, int] | None:
    """The plan's per-revision targets with the preempted replicas taken off (a rollout's own
    counts are left to the rollout planner)."""
    if current is not None or not dep.status.preempted:
        return current
    return {dep.revision: max(0, dep.replicas - dep.status.preempted)}


def restore(worker, snap: Snapshot, dep: InferenceDeployment) -> InferenceDeployment:
    """One preempted replica back when room returned (see the module docstring)."""
    preempted = min(dep.status.preempted, dep.replicas)
    if preempted != dep.status.preempted:  # scaled in meanwhile: fewer to bring back
        dep = _set_preempted(worker, dep, preempted)
    if not preempted:
        return dep
    rank = class_rank(dep.capacity_class)
    for other in snap.deployments.values():
        if other.name == dep.name or class_rank(other.capacity_class) <= rank:
            continue
        if short_of(snap, other) or other.status.preempted:
            return dep  # a higher class comes back (or gets its room) first
    profile, model, _ = snap.template(dep, dep.revision)
    if profile is None or model is None:
        return dep
    index = index_of(worker, snap)
    live = _live(snap.replicas.get(dep.name, []))
    if index.best(dep, profile, model, replicas=live) is None:
        return dep
    worker.events.deployment(dep, "PreemptedReturning", f"room returned: one preempted replica of {dep.name} is "
                             f"placed again ({preempted - 1} still preempted)")
    return _set_preempted(worker, dep, preempted - 1)


def _set_preempted(worker, dep: InferenceDeployment, count: int, by: str | None = None) -> InferenceDeployment:
    fields: dict = {"preempted": count}
    if by is not None:
        fields["preempted_by"] = by
    elif count == 0:
        fields["preempted_by"] = ""
    update_deployment_status(worker.store, dep.name, **fields)
    return dep.model_copy(update={"status": dep.status.model_copy(update=fields)})


async def after_plan(worker, snap: Snapshot, dep: InferenceDeployment, plan, errors: list[str]) -> Preemption | None:
    """Preempt for one missing replica of ``dep`` when it is short and above opportunistic; then
    the preempted state in its status (see the module docstring)."""
    status = plan.status
    result = None
    want = max(0, dep.replicas - dep.status.preempted)
    if (class_rank(dep.capacity_class) > 0 and status.phase == "Pending" and status.replicas < want
            and snap.rollouts.get(dep.name) is None):
        profile, model, _ = snap.template(dep, dep.revision)
        if profile is not None and model is not None:
            # What this plan created is in the snapshot already (the worker enters it before applying).
            index = index_of(worker, snap)
            live = _live(snap.replicas.get(dep.name, []))
            result = plan_preemption(index, dep, profile, model, holders_of(snap), replicas=live)
            if result.outcome == "preempt":
                await _drain_victims(worker, snap, dep, result, errors)
            holders = holders_of(snap)
            waited = [h for hs in holders.draining.values() for h in hs if h.replica_id in result.waiting_on]
            # Waiting is said only for room preemption made (a scale-in's drain is not news here).
            if result.outcome == "preempt" or any(class_rank(h.capacity_class) < class_rank(dep.capacity_class)
                                                  for h in waited):
                update_deployment_status(worker.store, dep.name,
                                         message=f"{status.message}; {result.message} (capacity_class "
                                                 f"{dep.capacity_class})")
    if dep.status.preempted:
        live = len(_live(snap.replicas.get(dep.name, [])))
        by = dep.status.preempted_by or "a higher capacity class"
        if live == 0 and dep.replicas > 0:
            update_deployment_status(worker.store, dep.name, phase=PREEMPTED_PHASE,
                                     message=f"all {dep.status.preempted} replica(s) preempted by {by} "
                                             f"(capacity_class {dep.capacity_class}); placed again when room returns")
        else:
            update_deployment_status(worker.store, dep.name,
                                     message=f"{status.message}; {dep.status.preempted} replica(s) preempted by "
                                             f"{by}; placed again when room returns")
    return result


async def _drain_victims(worker, snap: Snapshot, dep: InferenceDeployment, result: Preemption,
                         errors: list[str]) -> None:
    from controlplane.reconcile import plan as rp  # the reconcile actions (the applier's own vocabulary)

    now = worker.clock()
    for v in result.victims:
        victim_dep = snap.deployments.get(v.deployment)
        replica = get_replica(worker.store, v.deployment, v.replica_id)
        if victim_dep is None or replica is None or replica.draining:
            continue
        reason = (f"preempted by {dep.name} (capacity_class {dep.capacity_class}) for room on {result.node}; "
                  f"{victim_dep.name} is {victim_dep.capacity_class}")
        await worker._remove(victim_dep, replica, rp.StartDrain(v.replica_id, now + worker.settings.drain_grace_s,
                                                                 reason), snap.nodes, errors)
        worker.events.replica(victim_dep, v.replica_id, "Preempted", reason, warning=True)
        worker.events.deployment(victim_dep, "Preempted", f"replica {v.replica_id} on {v.node}: {reason}",
                                 warning=True)
        current = snap.deployments.get(v.deployment)
        fresh = _fresh_preempted(worker, v.deployment, current.status.preempted if current else 0)
        update_deployment_status(worker.store, v.deployment, preempted=fresh + 1, preempted_by=dep.name)
    worker.events.deployment(dep, "Preempting", result.message)


def _fresh_preempted(worker, name: str, fallback: int) -> int:
    try:
        dep = deployments.get(worker.store, name)
    except ValueError:
        return fallback
    return fallback if dep is None else int(dep.status.preempted)
