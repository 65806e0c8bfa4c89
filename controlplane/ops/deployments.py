"""Deployment operations: create, scale, set autoscaling, apply's in-place changes, delete.

  - A deployment naming a model or profile that does not exist (or that a tenant-bound caller
    may not see) is refused with 422 missing_reference naming it.
  - A tenant's GPU quota (controlplane.tenancy.quotas) is checked on create and on a scale up:
    over it is 409 naming the tenant, the quota and the use (and a QuotaRefused event); scaling
    down is always allowed. The check and the write run under the tenant's admission lock
    (controlplane.tenancy.admission), so concurrent creates and scales of one tenant can never
    together exceed its quota.
  - A tenant's deploy policy (controlplane.tenancy.policies) is checked on create, on a scale up
    and on a capacity class change: refused is 403 "policy_refused" naming each reason.
  - A deployment being deleted is 409 "deleting" for scale and autoscaling.
  - Delete: in use by a live endpoint is 409 in_use; with controllers running in this process the
    record is marked Deleting (the reconciler removes its replicas, then the record), else it is
    deleted at once.
Every change is recorded as an event; a create also writes revision 1.
"""

from __future__ import annotations

import time

from pydantic import Field

from common.errors import Conflict, InvalidInput
from common.records import Store, deployments, models
from common.records import rollouts as rollout_records
from common.schemas import AutoscalingSpec, DeploymentStatus, InferenceDeployment, Spec
from controlplane.ops import apply, common
from controlplane.state import AppState
from controlplane.tenancy import admission, policies, quotas
from controlplane.tenancy.principal import Principal, claimed


class ScaleRequest(Spec):
    replicas: int = Field(..., ge=0, le=64)


def _refuse_over_quota(ctx: AppState, name: str, refusal: quotas.QuotaRefusal | None) -> None:
    """409 naming the tenant, its quota and its use (the check is controlplane.tenancy.quotas)."""
    if refusal is not None:
        common.event(ctx, "deployment", name, "QuotaRefused", refusal.message, tenant=refusal.tenant,
                     type="Warning")
    quotas.refuse_over_quota(refusal)


def _with_model_residency(store: Store, body: InferenceDeployment) -> InferenceDeployment:
    """The model's residency is copied onto the deployment (docs/sites.md); a different one is 422."""
    model = models.stored(store, body.model)
    residency = model.get("residency") if model is not None else None
    if residency and body.residency and body.residency != residency:
        raise InvalidInput(f"residency {body.residency!r} differs from model {body.model}'s residency {residency!r}",
                           code="residency_conflict")
    return body.model_copy(update={"residency": body.residency or residency})


def create(ctx: AppState, caller: Principal, body: InferenceDeployment) -> InferenceDeployment:
    body = claimed(body, caller)
    missing = [f"{kind} {ref!r} does not exist" for kind, ref in (("model", body.model), ("profile", body.profile))
               if common.reference_missing(ctx.store, caller, kind, ref)]
    if missing:
        raise InvalidInput("; ".join(missing), code="missing_reference")
    policies.enforce(ctx.store, body.tenant, body.model, body.capacity_class, admin=common.acting_admin(caller))
    body = _with_model_residency(ctx.store, body)
    dep = common.fresh(body, DeploymentStatus(phase="Pending", message="waiting for placement"))
    dep = dep.model_copy(update={"revision": 1})
    message = f"deployment {dep.name}: model {dep.model}, profile {dep.profile}, {dep.replicas} replicas"
    # The quota check and the write are one step per tenant (controlplane.tenancy.admission).
    with admission.tenant_admission(ctx.store, body.tenant) as guard:
        _refuse_over_quota(ctx, body.name, quotas.check_deployment_change(
            ctx.store, body.name, body.tenant, body.profile, 0, body.replicas))
        admission.still_held(guard)
        # Leftovers of an earlier deployment of the same name go first; revision 1 follows the record.
        created = common.create(ctx, "deployment", dep, message)
    rollout_records.forget(ctx.store, dep.name)
    rollout_records.write_revision(ctx.store, dep.name, rollout_records.template_of(dep),
                                   who=caller.subject, reason="created", now=dep.created_at)
    return created


def scale(ctx: AppState, caller: Principal | None, name: str, body: ScaleRequest) -> InferenceDeployment:
    tenant = deployments.require(ctx.store, name).tenant
    # The quota check and the write are one step per tenant (controlplane.tenancy.admission).
    with admission.tenant_admission(ctx.store, tenant) as guard:
        before: list[int] = []

        def change(dep: InferenceDeployment) -> InferenceDeployment:
            if dep.status.phase == "Deleting":
                raise Conflict(f"deployment {name!r} is being deleted", code="deleting")
            before[:] = [dep.replicas]
            if body.replicas > dep.replicas:
                policies.enforce(ctx.store, dep.tenant, dep.model, dep.capacity_class, admin=common.acting_admin(caller))
                _refuse_over_quota(ctx, name, quotas.check_deployment_change(
                    ctx.store, name, dep.tenant, dep.profile, dep.replicas, body.replicas))
            dep.scale_to(body.replicas, time.time())
            admission.still_held(guard)
            return dep

        # Compare-and-swap: the reconciler writes status to the same record.
        dep = deployments.update(ctx.store, name, change,
                                 busy=f"deployment {name!r} changed too often while scaling; try again")
    common.event(ctx, "deployment", name, "scaled",
                 f"deployment {name} scaled from {before[0]} to {body.replicas} replicas", tenant=dep.tenant)
    return dep


def set_autoscaling(ctx: AppState, caller: Principal | None, name: str,
                    body: AutoscalingSpec) -> InferenceDeployment:
    """Store the autoscaling spec on the deployment (enabled: false keeps the spec, stops it)."""
    def set_spec(dep: InferenceDeployment) -> InferenceDeployment:
        if dep.status.phase == "Deleting":
            raise Conflict(f"deployment {name!r} is being deleted", code="deleting")
        dep.autoscaling = body
        return dep

    dep = deployments.update(ctx.store, name, set_spec)
    what = (f"autoscaling {body.min_replicas}-{body.max_replicas} replicas, scale out at queue > "
            f"{body.scale_out_queue:g} for {body.scale_out_seconds:g}s, in at < {body.scale_in_queue:g} "
            f"for {body.scale_in_seconds:g}s{', to zero when idle' if body.scale_to_zero else ''}")
    common.event(ctx, "deployment", name, "AutoscalingSet", what if body.enabled else "autoscaling disabled",
                 tenant=dep.tenant)
    return dep


def _merge(ctx: AppState, name: str, changes: dict) -> InferenceDeployment:
    return apply.merge(ctx, deployments.RECORDS, name, changes, label="InferenceDeployment", event_kind="deployment")


def clear_autoscaling(ctx: AppState, caller: Principal | None, name: str) -> InferenceDeployment:
    """Remove the autoscaling spec (apply with `autoscaling: null`)."""
    return _merge(ctx, name, {"autoscaling": None})


def set_capacity_class(ctx: AppState, caller: Principal | None, name: str,
                       capacity_class: str) -> InferenceDeployment:
    """Change the capacity class in place, after the tenant policy's check (allowed_capacity_classes)."""
    stored = deployments.stored(ctx.store, name) or {}
    policies.enforce(ctx.store, stored.get("tenant"), str(stored.get("model", "")), capacity_class,
                     admin=common.acting_admin(caller))
    return _merge(ctx, name, {"capacity_class": capacity_class})


def update(ctx: AppState, caller: Principal | None, name: str, changes: dict) -> InferenceDeployment | None:
    """Apply's in-place changes: replicas as scale, autoscaling as set_autoscaling (the same checks
    and events as the imperative commands), capacity_class after the tenant policy's check."""
    record = None
    if "replicas" in changes:
        record = scale(ctx, caller, name, ScaleRequest(replicas=changes["replicas"]))
    if "autoscaling" in changes:
        if changes["autoscaling"] is None:
            record = clear_autoscaling(ctx, caller, name)
        else:
            record = set_autoscaling(ctx, caller, name, AutoscalingSpec.model_validate(changes["autoscaling"]))
    if "capacity_class" in changes:
        record = set_capacity_class(ctx, caller, name, changes["capacity_class"])
    return record


def delete(ctx: AppState, caller: Principal | None, name: str) -> common.Deletion:
    tenant = common.stored(ctx.store, "deployment", name).get("tenant")
    # An endpoint being deleted no longer uses it (its VIP only drains the calls in flight).
    live = [e for e in common.stored_list(ctx.store, "endpoint") if e.get("status", {}).get("phase") != "Deleting"]
    common.refuse_if_used("deployment", name, "endpoint", common.users_of(live, "deployment", name))
    if not ctx.controllers_running:
        deleted = common.delete(ctx, "deployment", name, tenant)
        rollout_records.forget(ctx.store, name)
        return deleted
    dep, _ = common.mark_deleting(ctx, "deployment", name,
                                  {"phase": "Deleting", "message": "deletion requested; removing replicas"})
    return common.Deletion(dep)  # None: the reconciler finished meanwhile

