"""Desired-state resources: models, profiles, deployments (with scale) and endpoints.

Each resource is stored as its pydantic JSON at its common.keyspace path; creation uses the
store's create-if-absent, so a duplicate name is 409 even between several fabricd processes.
Reads return the stored JSON as is (not re-validated, so a profile stays readable after its
runtime is later denied by FABRIC_DENY_RUNTIMES).

Choices the issue leaves open (also in docs/api.md):
  - A deployment naming a model or profile that does not exist is refused with 422 naming it,
    and an endpoint naming a missing deployment likewise; a reference that disappears later
    (a race with a delete) is the reconciler's to mark Failed.
  - Deleting a model or profile that a deployment uses is 409 naming the deployment; deleting a
    deployment that an endpoint exposes is 409 naming the endpoint.
  - Deleting a deployment while controllers run in this process marks it phase "Deleting"
    (202) and the reconciler removes its replicas, then the record; with no controllers the
    record is deleted at once (200).
  - A tenant's GPU quota (controlplane.tenancy.quotas) is checked on create and on a scale up:
    over it is 409 naming the tenant, the quota and the use; scaling down is always allowed. The
    check and the write run under the tenant's admission lock (controlplane.tenancy.admission),
    so concurrent creates and scales of one tenant can never together exceed its quota.
  - A tenant's deploy policy (controlplane.tenancy.policies) is checked on create and on a scale
    up: refused is 403 "policy_refused" naming each reason.
  - A new endpoint is stored with phase "Pending"; the orchestration controller assigns its VIP.
    Deleting an endpoint deletes the record; that controller releases the VIP it held.
Every create, delete and scale is recorded with controlplane.events.record_event.
Tenancy (controlplane.tenancy, rules in route_rules): a tenant-bound caller's lists hold only
what it may see, its creates get its tenant (naming another is 403 "tenant_mismatch"), and a
reference it may not see reads as missing (422 missing_reference, like a name that is absent).
The four lists page (controlplane.api.paging): ?limit (default 500, at most 1000) and ?continue.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Response
from pydantic import Field

from common.errors import Conflict, Forbidden, InvalidInput, NotFound
from common.schemas import (
    DeploymentStatus,
    EndpointStatus,
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    ModelArtifact,
    ModelStatus,
    Spec,
    runtime_refusal,
)
from controlplane.api.answers import Deleted
from controlplane.api.paging import DEFAULT_LIMIT, ContinueQuery, LimitQuery, page
from controlplane.auth import PrincipalDep, require_admin
from controlplane.events import record_event
from controlplane.models.sources import check_local_source
from controlplane.records import Store, deployments, endpoints, models
from controlplane.records import rollouts as rollout_records
from controlplane.records.kinds import BY_KIND
from controlplane.records.model_jobs import delete_jobs
from controlplane.settings import of as settings_of
from controlplane.state import AppState, StateDep
from controlplane.tenancy import admission, model_sources, owners, policies, quotas
from controlplane.tenancy.principal import ADMIN, Principal, claimed, visible

router = APIRouter(prefix="/api/ai", tags=["resources"], dependencies=[Depends(require_admin)])

SCALE_RETRIES = 20


class ScaleRequest(Spec):
    replicas: int = Field(..., ge=0, le=64)


# -- record helpers (thin: controlplane.records holds the store calls) ---------------------------

def _get(store: Store, kind: str, name: str) -> dict:
    """The record as stored (reads answer it as is); NotFound naming it."""
    found = BY_KIND[kind].stored(store, name)
    if found is None:
        raise NotFound(f"{kind} {name!r} not found")
    return found


def _list(store: Store, kind: str) -> list[dict]:
    return [value for _, value in BY_KIND[kind].stored_items(store)]


def _create(state: AppState, kind: str, resource, message: str) -> dict:
    resource = BY_KIND[kind].create(state.store, resource)
    record_event(state.store, kind, resource.name, "created", message,
                 tenant=resource.tenant, keep=state.settings.events_kept,
                 max_age_s=state.settings.events_max_age_s)
    return resource.model_dump(mode="json")


def _delete(state: AppState, kind: str, name: str, tenant: str | None = None) -> Deleted:
    BY_KIND[kind].delete(state.store, name)
    record_event(state.store, kind, name, "deleted", f"{kind} {name} deleted", tenant=tenant,
                 keep=state.settings.events_kept, max_age_s=state.settings.events_max_age_s)
    return Deleted(kind=kind, name=name)


def _list_page(state: AppState, kind: str, response: Response, who: Principal, limit: int,
               after: str | None) -> list[dict]:
    return page(BY_KIND[kind].stored_items(state.store), response, limit, after, _keep(who, kind))


def _keep(who: Principal, kind: str):
    """A list's tenant filter (None for a cluster-wide caller: everything)."""
    return owners.visible_record(who, kind) if who.bound else None


def reference_missing(store: Store, who: Principal, kind: str, name: str) -> bool:
    """True when `name` is absent, or (for a tenant-bound caller) not its tenant's to see."""
    found = BY_KIND[kind].stored(store, name)
    return found is None or not visible(who, kind, found.get("tenant"))


def _refuse_over_quota(state: AppState, name: str, refusal: quotas.QuotaRefusal | None) -> None:
    """409 naming the tenant, its quota and its use (the check is controlplane.tenancy.quotas)."""
    if refusal is not None:
        record_event(state.store, "deployment", name, "QuotaRefused", refusal.message, tenant=refusal.tenant,
                     keep=state.settings.events_kept, max_age_s=state.settings.events_max_age_s, type="Warning")
    quotas.refuse_over_quota(refusal)


# -- pure decisions ------------------------------------------------------------------------------

def users_of(records: list[dict], field: str, name: str) -> list[str]:
    """Names of the records whose `field` refers to `name`."""
    return sorted(r["name"] for r in records if r.get(field) == name)


def refuse_if_used(kind: str, name: str, user_kind: str, users: list[str]) -> None:
    if users:
        listed = ", ".join(users)
        raise Conflict(f"{kind} {name!r} is in use by {user_kind} {listed}; delete {'it' if len(users) == 1 else 'them'} "
                       "first", code="in_use")


def _fresh(resource, status):
    """The stored form of a new resource: server-side creation time and initial status."""
    return resource.model_copy(update={"created_at": time.time(), "status": status})


# -- models ---------------------------------------------------------------------------------------

@router.get("/models", response_model=list[ModelArtifact])
def list_models(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "model", response, who, limit, after)


@router.post("/models", status_code=201, response_model=ModelArtifact)
def create_model(body: ModelArtifact, state: StateDep, who: PrincipalDep) -> dict:
    body = claimed(body, who)
    model_dir = settings_of(state).model_dir  # FABRIC_MODEL_DIR, read at start
    check_local_source(body.source, model_dir)
    for adapter in body.adapters:
        check_local_source(adapter.source, model_dir)
    # A tenant-bound caller: its own model root, and only allow-listed hf:// repositories.
    model_sources.check(state.store, who, [body.source, *(a.source for a in body.adapters)], model_dir)
    model = _fresh(body, ModelStatus(phase="Registered", message="model registered"))
    return _create(state, "model", model, f"model {model.name} from {model.source}")


@router.get("/models/{name}", response_model=ModelArtifact)
def get_model(name: str, state: StateDep) -> dict:
    return _get(state.store, "model", name)


@router.delete("/models/{name}", response_model=Deleted)
def delete_model(name: str, state: StateDep) -> Deleted:
    tenant = _get(state.store, "model", name).get("tenant")
    refuse_if_used("model", name, "deployment", users_of(_list(state.store, "deployment"), "model", name))
    refuse_if_used("model", name, "rollout of", rollout_records.rollout_users(state.store, "model", name))
    deleted = _delete(state, "model", name, tenant)
    delete_jobs(state.store, name)  # the cached bytes stay until evicted
    return deleted


# -- profiles -------------------------------------------------------------------------------------

@router.get("/profiles", response_model=list[InferenceProfile])
def list_profiles(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                  after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "profile", response, who, limit, after)


@router.post("/profiles", status_code=201, response_model=InferenceProfile)
def create_profile(body: InferenceProfile, state: StateDep, who: PrincipalDep) -> dict:
    config = settings_of(state)  # FABRIC_DENY_RUNTIMES / FABRIC_ALLOW_RUNTIMES, read at start
    refusal = runtime_refusal(body.runtime, config.deny_runtimes, config.allow_runtimes)
    if refusal is not None:
        raise InvalidInput(f"body.runtime: {refusal}")
    profile = claimed(body, who).model_copy(update={"created_at": time.time()})
    gpu = profile.gpu
    message = f"profile {profile.name}: {profile.runtime}, {gpu.count} GPU x {gpu.vram_gib:g} GiB"
    return _create(state, "profile", profile, message)


@router.get("/profiles/{name}", response_model=InferenceProfile)
def get_profile(name: str, state: StateDep) -> dict:
    return _get(state.store, "profile", name)


@router.delete("/profiles/{name}", response_model=Deleted)
def delete_profile(name: str, state: StateDep) -> Deleted:
    tenant = _get(state.store, "profile", name).get("tenant")
    refuse_if_used("profile", name, "deployment",
                   users_of(_list(state.store, "deployment"), "profile", name))
    refuse_if_used("profile", name, "rollout of", rollout_records.rollout_users(state.store, "profile", name))
    return _delete(state, "profile", name, tenant)


# -- deployments ----------------------------------------------------------------------------------

@router.get("/deployments", response_model=list[InferenceDeployment])
def list_deployments(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                     after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "deployment", response, who, limit, after)


@router.post("/deployments", status_code=201, response_model=InferenceDeployment)
def create_deployment(body: InferenceDeployment, state: StateDep, who: PrincipalDep) -> dict:
    body = claimed(body, who)
    missing = [f"{kind} {ref!r} does not exist" for kind, ref in (("model", body.model), ("profile", body.profile))
               if reference_missing(state.store, who, kind, ref)]
    if missing:
        raise InvalidInput("; ".join(missing), code="missing_reference")
    policies.enforce(state.store, body.tenant, body.model, body.capacity_class)
    body = _with_model_residency(state.store, body)
    dep = _fresh(body, DeploymentStatus(phase="Pending", message="waiting for placement"))
    dep = dep.model_copy(update={"revision": 1})
    message = f"deployment {dep.name}: model {dep.model}, profile {dep.profile}, {dep.replicas} replicas"
    # The quota check and the write are one step per tenant (controlplane.tenancy.admission).
    with admission.tenant_admission(state.store, body.tenant) as guard:
        _refuse_over_quota(state, body.name, quotas.check_deployment_change(
            state.store, body.name, body.tenant, body.profile, 0, body.replicas))
        admission.still_held(guard)
        # Leftovers of an earlier deployment of the same name go first; revision 1 follows the record.
        created = _create(state, "deployment", dep, message)
    rollout_records.forget(state.store, dep.name)
    rollout_records.write_revision(state.store, dep.name, rollout_records.template_of(dep), who=who.subject, reason="created",
                           now=dep.created_at)
    return created


def _with_model_residency(store: Store, body: InferenceDeployment) -> InferenceDeployment:
    """The model's residency is copied onto the deployment (docs/sites.md); a different one is 422."""
    model = models.stored(store, body.model)
    residency = model.get("residency") if model is not None else None
    if residency and body.residency and body.residency != residency:
        raise InvalidInput(f"residency {body.residency!r} differs from model {body.model}'s residency {residency!r}",
                           code="residency_conflict")
    return body.model_copy(update={"residency": body.residency or residency})


@router.get("/deployments/{name}", response_model=InferenceDeployment)
def get_deployment(name: str, state: StateDep) -> dict:
    return _get(state.store, "deployment", name)


@router.post("/deployments/{name}/scale", response_model=InferenceDeployment)
def scale_deployment(name: str, body: ScaleRequest, state: StateDep) -> dict:
    tenant = deployments.require(state.store, name).tenant
    # The quota check and the write are one step per tenant (controlplane.tenancy.admission).
    with admission.tenant_admission(state.store, tenant) as guard:
        return _scale(state, name, body, guard)


def _scale(state: AppState, name: str, body: ScaleRequest, guard) -> dict:
    before: list[int] = []

    def scale(dep: InferenceDeployment) -> InferenceDeployment:
        if dep.status.phase == "Deleting":
            raise Conflict(f"deployment {name!r} is being deleted", code="deleting")
        before[:] = [dep.replicas]
        if body.replicas > dep.replicas:
            policies.enforce(state.store, dep.tenant, dep.model, dep.capacity_class)
            _refuse_over_quota(state, name, quotas.check_deployment_change(
                state.store, name, dep.tenant, dep.profile, dep.replicas, body.replicas))
        dep.replicas = body.replicas
        admission.still_held(guard)
        return dep

    # Compare-and-swap: the reconciler writes status to the same record.
    dep = deployments.update(state.store, name, scale, retries=SCALE_RETRIES,
                             busy=f"deployment {name!r} changed too often while scaling; try again")
    record_event(state.store, "deployment", name, "scaled",
                 f"deployment {name} scaled from {before[0]} to {body.replicas} replicas",
                 tenant=dep.tenant, keep=state.settings.events_kept, max_age_s=state.settings.events_max_age_s)
    return dep.model_dump(mode="json")


def _mark_deleting(state: AppState, kind: str, name: str, status: dict) -> tuple[object | None, bool]:
    """Compare-and-swap ``status`` (phase Deleting) onto the record: (record, newly marked);
    (None, False) when the record went meanwhile (its controller finished)."""
    marked: list[bool] = []

    def mark(record):
        marked[:] = [record.status.phase != "Deleting"]
        if not marked[0]:
            return None
        record.status = record.status.model_copy(update=status)
        return record

    try:
        record = BY_KIND[kind].update(state.store, name, mark, retries=SCALE_RETRIES,
                                      busy=f"{kind} {name!r} changed too often while deleting; try again")
    except NotFound:
        return None, False
    if marked[0]:
        record_event(state.store, kind, name, "deleting", f"{kind} {name} deletion requested",
                     tenant=record.tenant, keep=state.settings.events_kept,
                     max_age_s=state.settings.events_max_age_s)
    return record, marked[0]


@router.delete("/deployments/{name}", responses={202: {"description": "controllers run here: marked Deleting; "
                                                                  "the reconciler removes its replicas, then the record"}})
def delete_deployment(name: str, response: Response, state: StateDep) -> dict:
    tenant = _get(state.store, "deployment", name).get("tenant")
    # An endpoint being deleted no longer uses it (its VIP only drains the calls in flight).
    live = [e for e in _list(state.store, "endpoint") if e.get("status", {}).get("phase") != "Deleting"]
    refuse_if_used("deployment", name, "endpoint", users_of(live, "deployment", name))
    if not state.controllers_running:
        deleted = _delete(state, "deployment", name, tenant).model_dump()
        rollout_records.forget(state.store, name)
        return deleted
    dep, _ = _mark_deleting(state, "deployment", name,
                            {"phase": "Deleting", "message": "deletion requested; removing replicas"})
    if dep is None:  # the reconciler finished meanwhile
        return Deleted(kind="deployment", name=name).model_dump()
    response.status_code = 202
    return dep.model_dump(mode="json")


# -- endpoints ------------------------------------------------------------------------------------

def outbound_reach(endpoint: InferenceEndpoint) -> bool:
    """Does this endpoint send callers' prompts out of the cluster, with a provider key read from
    the gateway host (an external provider, or fallbacks to external endpoints)?"""
    return endpoint.external is not None or bool(endpoint.fallbacks)


def refuse_outbound_reach(who: Principal | None, endpoint: InferenceEndpoint) -> None:
    """Only an admin creates, changes or deletes an endpoint with outbound reach: its URL and key
    files choose which of the gateway host's provider keys go where, so an operator could send
    another team's provider key to a URL of its own. Every path that writes endpoints (this API,
    apply, restore; the console goes through this API) calls this. None: no user (internal)."""
    if who is not None and who.role != ADMIN and outbound_reach(endpoint):
        raise Forbidden("only an admin may create, change or delete an endpoint with an external provider "
                        "or fallbacks; ask an admin", code="forbidden")


@router.get("/endpoints", response_model=list[InferenceEndpoint])
def list_endpoints(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                   after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "endpoint", response, who, limit, after)


@router.post("/endpoints", status_code=201, response_model=InferenceEndpoint)
def create_endpoint(body: InferenceEndpoint, state: StateDep, who: PrincipalDep) -> dict:
    body = claimed(body, who)
    refuse_outbound_reach(who, body)
    # An external endpoint forwards to its provider; its deployment is a name only (never read).
    for dep in ([] if body.external else [body.deployment]) + body.spillover:
        if reference_missing(state.store, who, "deployment", dep):
            raise InvalidInput(f"deployment {dep!r} does not exist", code="missing_reference")
    for name in body.fallbacks:
        if reference_missing(state.store, who, "endpoint", name) or \
                endpoints.require(state.store, name).external is None:
            raise InvalidInput(f"fallbacks: {name!r} is not an external endpoint", code="missing_reference")
    ep = _fresh(body, EndpointStatus(phase="Pending", message="waiting for a VIP"))
    message = f"endpoint {ep.name} exposes deployment {ep.deployment} (routing {ep.routing})"
    return _create(state, "endpoint", ep, message)


@router.get("/endpoints/{name}", response_model=InferenceEndpoint)
def get_endpoint(name: str, state: StateDep) -> dict:
    return _get(state.store, "endpoint", name)


@router.delete("/endpoints/{name}", response_model=Deleted,
               responses={202: {"description": "controllers run here: marked Deleting; its VIP drains the calls "
                                               "in flight, then the routing controller releases it and the record"}})
def delete_endpoint(name: str, response: Response, state: StateDep, who: PrincipalDep) -> Deleted:
    record = _get(state.store, "endpoint", name)
    refuse_outbound_reach(who, InferenceEndpoint.model_validate(record))
    tenant = record.get("tenant")
    if not state.controllers_running or record.get("external"):
        return _delete(state, "endpoint", name, tenant)
    ep, _ = _mark_deleting(state, "endpoint", name, {
        "phase": "Deleting", "message": "deletion requested; the VIP drains the calls in flight",
        "deleting_since": time.time()})
    if ep is None:  # the routing controller finished meanwhile
        return Deleted(kind="endpoint", name=name)
    response.status_code = 202
    return Deleted(kind="endpoint", name=name, deleted=False)  # Deleting: its VIP drains first
