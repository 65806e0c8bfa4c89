"""Desired-state resources over REST: models, profiles, deployments (with scale) and endpoints.

The routes are thin: parse, call the operation in controlplane.ops (deployments, endpoints,
models, profiles), answer. What each operation checks (references, quota under the tenant's
admission lock, deploy policy, outbound reach, in-use deletes) is written in its module. Reads
return the stored JSON as is (not re-validated, so a profile stays readable after its runtime is
later denied by FABRIC_DENY_RUNTIMES).

Choices the issue leaves open (also in docs/api.md):
  - A reference that disappears after a create (a race with a delete) is the reconciler's to mark
    Failed.
  - Deleting a deployment while controllers run in this process marks it phase "Deleting"
    (202) and the reconciler removes its replicas, then the record; with no controllers the
    record is deleted at once (200). An endpoint likewise (202, its VIP drains first).
Tenancy (controlplane.tenancy, rules in route_rules): a tenant-bound caller's lists hold only
what it may see, its creates get its tenant (naming another is 403 "tenant_mismatch"), and a
reference it may not see reads as missing (422 missing_reference, like a name that is absent).
The four lists page (controlplane.api.paging): ?limit (default 500, at most 1000) and ?continue.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Response

from common.records.kinds import BY_KIND
from common.schemas import InferenceDeployment, InferenceEndpoint, InferenceProfile, ModelArtifact
from controlplane.api.answers import Deleted
from controlplane.api.paging import DEFAULT_LIMIT, ContinueQuery, LimitQuery, page
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import deployments as deployment_ops
from controlplane.ops import endpoints as endpoint_ops
from controlplane.ops import models as model_ops
from controlplane.ops import profiles as profile_ops
from controlplane.ops.common import stored
from controlplane.ops.deployments import ScaleRequest
from controlplane.state import AppState, StateDep
from controlplane.tenancy import owners
from controlplane.tenancy.principal import Principal

router = APIRouter(prefix="/api/ai", tags=["resources"], dependencies=[Depends(require_admin)])


def _list_page(state: AppState, kind: str, response: Response, who: Principal, limit: int,
               after: str | None) -> list[dict]:
    keep = owners.visible_record(who, kind) if who.bound else None  # None: a cluster-wide caller
    return page(BY_KIND[kind].stored_items(state.store), response, limit, after, keep)


# -- models ---------------------------------------------------------------------------------------

@router.get("/models", response_model=list[ModelArtifact])
def list_models(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "model", response, who, limit, after)


@router.post("/models", status_code=201, response_model=ModelArtifact)
def create_model(body: ModelArtifact, state: StateDep, who: PrincipalDep, response: Response,
                 dry_run: bool = Query(False, description="check everything a create checks; write nothing "
                                       "(200 with the record it would write)")) -> dict:
    model = model_ops.create(state, who, body, dry_run=dry_run)
    if dry_run:
        response.status_code = 200
    return model.model_dump(mode="json")


@router.get("/models/{name}", response_model=ModelArtifact)
def get_model(name: str, state: StateDep) -> dict:
    return stored(state.store, "model", name)


@router.delete("/models/{name}", response_model=Deleted)
def delete_model(name: str, state: StateDep, who: PrincipalDep) -> Deleted:
    model_ops.delete(state, who, name)
    return Deleted(kind="model", name=name)


# -- profiles -------------------------------------------------------------------------------------

@router.get("/profiles", response_model=list[InferenceProfile])
def list_profiles(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                  after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "profile", response, who, limit, after)


@router.post("/profiles", status_code=201, response_model=InferenceProfile)
def create_profile(body: InferenceProfile, state: StateDep, who: PrincipalDep) -> dict:
    return profile_ops.create(state, who, body).model_dump(mode="json")


@router.get("/profiles/{name}", response_model=InferenceProfile)
def get_profile(name: str, state: StateDep) -> dict:
    return stored(state.store, "profile", name)


@router.delete("/profiles/{name}", response_model=Deleted)
def delete_profile(name: str, state: StateDep, who: PrincipalDep) -> Deleted:
    profile_ops.delete(state, who, name)
    return Deleted(kind="profile", name=name)


# -- deployments ----------------------------------------------------------------------------------

@router.get("/deployments", response_model=list[InferenceDeployment])
def list_deployments(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                     after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "deployment", response, who, limit, after)


@router.post("/deployments", status_code=201, response_model=InferenceDeployment)
def create_deployment(body: InferenceDeployment, state: StateDep, who: PrincipalDep) -> dict:
    return deployment_ops.create(state, who, body).model_dump(mode="json")


@router.get("/deployments/{name}", response_model=InferenceDeployment)
def get_deployment(name: str, state: StateDep) -> dict:
    return stored(state.store, "deployment", name)


@router.post("/deployments/{name}/scale", response_model=InferenceDeployment)
def scale_deployment(name: str, body: ScaleRequest, state: StateDep, who: PrincipalDep) -> dict:
    return deployment_ops.scale(state, who, name, body).model_dump(mode="json")


@router.delete("/deployments/{name}", response_model=Deleted | InferenceDeployment,
               responses={202: {"description": "controllers run here: marked Deleting (the deployment, phase "
                                               "Deleting); the reconciler removes its replicas, then the record"}})
def delete_deployment(name: str, response: Response, state: StateDep, who: PrincipalDep) -> dict:
    deletion = deployment_ops.delete(state, who, name)
    if deletion.record is None:
        return Deleted(kind="deployment", name=name).model_dump()
    response.status_code = 202
    return deletion.record.model_dump(mode="json")


# -- endpoints ------------------------------------------------------------------------------------

@router.get("/endpoints", response_model=list[InferenceEndpoint])
def list_endpoints(state: StateDep, response: Response, who: PrincipalDep, limit: LimitQuery = DEFAULT_LIMIT,
                   after: ContinueQuery = None) -> list[dict]:
    return _list_page(state, "endpoint", response, who, limit, after)


@router.post("/endpoints", status_code=201, response_model=InferenceEndpoint)
def create_endpoint(body: InferenceEndpoint, state: StateDep, who: PrincipalDep) -> dict:
    return endpoint_ops.create(state, who, body).model_dump(mode="json")


@router.get("/endpoints/{name}", response_model=InferenceEndpoint)
def get_endpoint(name: str, state: StateDep) -> dict:
    return stored(state.store, "endpoint", name)


@router.delete("/endpoints/{name}", response_model=Deleted,
               responses={202: {"description": "controllers run here: marked Deleting; its VIP drains the calls "
                                               "in flight, then the routing controller releases it and the record"}})
def delete_endpoint(name: str, response: Response, state: StateDep, who: PrincipalDep) -> Deleted:
    if endpoint_ops.delete(state, who, name).pending:
        response.status_code = 202
        return Deleted(kind="endpoint", name=name, deleted=False)  # Deleting: its VIP drains first
    return Deleted(kind="endpoint", name=name)
