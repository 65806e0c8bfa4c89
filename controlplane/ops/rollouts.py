"""Rollout operations: start a rollout of a deployment to a revision.

``start`` is the one operation behind ``POST /api/ai/deployments/{name}/rollouts`` and its
singular alias ``/rollout``. Beyond the record's own checks (controlplane.rollouts.operate), a
rollout's peak adds replicas next to the old set: ``min(max_surge, N)`` for rolling, N for
canary (its last step runs N new beside N old) and blue/green. That surge, at the new revision's
profile, passes the tenant's quota (GPUs, CPU, memory: controlplane.tenancy.quotas) under the
tenant's admission lock like any other growth, else 409 quota_exceeded naming the numbers and a
QuotaRefused event. The surge is admitted once, at the start: while the rollout runs, the tenant's
use counts the deployment's desired replicas only.
"""

from __future__ import annotations

import time

from common.errors import Conflict, NotFound
from common.rollouts import Revision, Rollout, RolloutRequest
from common.schemas import InferenceDeployment
from controlplane.ops import common
from controlplane.orchestration_state import load_deployment
from controlplane.records import rollouts as rollout_records
from controlplane.rollouts import operate
from controlplane.state import AppState
from controlplane.tenancy import admission, quotas
from controlplane.tenancy.principal import Principal


def deployment(ctx: AppState, name: str) -> InferenceDeployment:
    dep, _ = load_deployment(ctx.store, name)
    if dep is None:
        raise NotFound(f"deployment {name!r} not found")
    return dep


def ensure_first_revision(ctx: AppState, dep: InferenceDeployment, who: str = "fabricd") -> list[Revision]:
    """The revisions of ``dep``; a deployment made before revisions existed gets its revision
    (its current template) recorded first."""
    revs = rollout_records.list_revisions(ctx.store, dep.name)
    if not revs:
        rollout_records.write_revision(ctx.store, dep.name, rollout_records.template_of(dep), who=who,
                                       reason="recorded from the running deployment", now=time.time())
        revs = rollout_records.list_revisions(ctx.store, dep.name)
    return revs


def surge_replicas(strategy: str, replicas: int, max_surge: int) -> int:
    """Pure: the most replicas a rollout runs beyond the deployment's count at once."""
    return min(max_surge, replicas) if strategy == "rolling" else replicas


def start(ctx: AppState, caller: Principal | None, name: str, body: RolloutRequest) -> Rollout:
    who = caller.subject if caller is not None else "fabricd"
    dep = deployment(ctx, name)
    if dep.status.phase == "Deleting":
        raise Conflict(f"deployment {name!r} is being deleted", code="deleting")
    revs = ensure_first_revision(ctx, dep, who)
    to = body.to_revision if body.to_revision is not None else revs[-1].revision
    target = rollout_records.get_revision(ctx.store, name, to)
    if target is None:
        raise NotFound(f"revision {to} of deployment {name!r} not found")
    existing = rollout_records.list_rollouts(ctx.store, name)
    if existing and existing[-1][0].active:
        cur = existing[-1][0]
        raise Conflict(f"rollout {cur.id} of {name!r} is still {cur.phase}; promote, roll back or wait for it",
                       code="rollout_active")
    rid = existing[-1][0].id + 1 if existing else 1
    rec = operate.start(body, rollout_id=rid, deployment=name, from_revision=dep.revision, to_revision=to,
                        replicas=dep.replicas, who=who, now=time.time())
    extra = surge_replicas(rec.strategy, rec.replicas, rec.max_surge)
    with admission.tenant_admission(ctx.store, dep.tenant) as guard:
        one = quotas.per_replica(ctx.store).get(target.template.profile, quotas.UNKNOWN_PROFILE)
        refusal = quotas.check_growth(ctx.store, name, dep.tenant, one.times(extra))
        if refusal is not None:
            common.event(ctx, "deployment", name, "QuotaRefused", f"rollout to revision {to}: {refusal.message}",
                         tenant=refusal.tenant, type="Warning")
        quotas.refuse_over_quota(refusal)
        admission.still_held(guard)
        if not rollout_records.create_rollout(ctx.store, rec):
            raise Conflict(f"another rollout of {name!r} started at the same time", code="rollout_active")
    rollout_records.prune_rollouts(ctx.store, name)
    common.event(ctx, "rollout", name, "started", f"rollout {rid}: {rec.strategy} from revision "
                 f"{rec.from_revision} to {rec.to_revision}, {rec.replicas} replicas", tenant=dep.tenant)
    return rec
