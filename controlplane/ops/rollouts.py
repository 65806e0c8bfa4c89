"""Rollout operations: write a revision, start a rollout of a deployment to it, act on a rollout.

A revision names a model and a profile that exist (another tenant's read as missing: 422
missing_reference); a new model passes the tenant's deploy policy (controlplane.tenancy.policies,
403 policy_refused), as a deployment's create does; a template equal to the newest revision is
409 unchanged. Writing a revision does not touch running replicas; a rollout moves them.

``start`` is the one operation behind ``POST /api/ai/deployments/{name}/rollouts`` and its
singular alias ``/rollout``. Beyond the record's own checks (controlplane.rollouts.operate), a
rollout's peak adds replicas next to the old set: ``min(max_surge, N)`` for rolling, N for
canary (its last step runs N new beside N old) and blue/green. That surge, at the new revision's
profile, passes the tenant's quota (GPUs, CPU, memory: controlplane.tenancy.quotas) under the
tenant's admission lock like any other growth, else 409 quota_exceeded naming the numbers and a
QuotaRefused event. While the rollout is active its surge stays counted in the tenant's use
(controlplane.tenancy.quotas.rollout_surges), so another rollout, create or scale cannot take
those GPUs again before it ends.

Operator actions (pause, resume, promote, rollback: controlplane.rollouts.operate) change the
record by compare-and-swap, so an action and the leader's tick never overwrite each other. Every
revision, start and action is an event.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from common.errors import Conflict, InvalidInput, NotFound
from common.records import rollouts as rollout_records
from common.rollouts import Revision, Rollout, RolloutRequest
from common.schemas import InferenceDeployment, Template, check_engine_args, check_name
from controlplane.ops import common
from controlplane.orchestration_state import load_deployment
from controlplane.rollouts import operate
from controlplane.state import AppState
from controlplane.tenancy import admission, policies, quotas
from controlplane.tenancy.principal import Principal


class RevisionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    profile: str | None = None
    engine_args: list[str] | None = None
    reason: str = Field("", max_length=500)


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


def create_revision(ctx: AppState, caller: Principal, name: str, body: RevisionRequest) -> Revision:
    """Revision N+1 of deployment ``name``: the fields ``body`` omits are the newest revision's."""
    who = caller.subject
    dep = deployment(ctx, name)
    if dep.status.phase == "Deleting":
        raise Conflict(f"deployment {name!r} is being deleted", code="deleting")
    newest = ensure_first_revision(ctx, dep, who)[-1].template
    try:
        template = Template(model=check_name(body.model, "model") if body.model else newest.model,
                            profile=check_name(body.profile, "profile") if body.profile else newest.profile,
                            engine_args=check_engine_args(body.engine_args) if body.engine_args is not None
                            else list(newest.engine_args))
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    # Another tenant's model or profile reads as missing, as on create (controlplane.tenancy).
    missing = [f"{kind} {ref!r} does not exist" for kind, ref in (("model", template.model),
                                                                  ("profile", template.profile))
               if common.reference_missing(ctx.store, caller, kind, ref)]
    if missing:
        raise InvalidInput("; ".join(missing), code="missing_reference")
    if template.model != newest.model:  # the model only: a profile or engine args are not the policy's
        policies.enforce(ctx.store, dep.tenant, template.model, admin=common.acting_admin(caller))
    if template == newest:
        raise Conflict(f"the template equals deployment {name!r}'s newest revision; nothing to write",
                       code="unchanged")
    rev = rollout_records.write_revision(ctx.store, name, template, who=who, reason=body.reason, now=time.time())
    # Engine args may carry a secret (a token flag): the event names only how many there are.
    common.event(ctx, "rollout", name, "revision", f"revision {rev.revision}: model {template.model}, profile "
                 f"{template.profile}, {len(template.engine_args)} engine args")
    return rev


def act(ctx: AppState, caller: Principal | None, name: str, rollout_id: int, action: str) -> Rollout:
    """pause, resume, promote or rollback rollout ``rollout_id`` of deployment ``name``."""
    if action not in operate.ACTIONS:
        raise NotFound(f"no rollout action {action!r}; expected one of {', '.join(operate.ACTIONS)}")
    try:
        new = rollout_records.update_rollout(ctx.store, name, rollout_id,
                                             lambda rec: operate.operate(rec, action, time.time()))
    except NotFound:
        raise NotFound(f"rollout {rollout_id} of deployment {name!r} not found") from None
    who = caller.subject if caller is not None else "fabricd"
    common.event(ctx, "rollout", name, action, f"rollout {rollout_id}: {action} by {who}")
    return new


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
    extra = quotas.surge_replicas(rec.strategy, rec.replicas, rec.max_surge)
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
