"""Identity mappings for the gateway's inference OIDC callers (common.identity_mappings), admin only.

    POST   /api/ai/identity-mappings          {name, claim, value, endpoints, issuer?, tenant?}: create or replace
    GET    /api/ai/identity-mappings          every mapping, by name
    GET    /api/ai/identity-mappings/{name}
    DELETE /api/ai/identity-mappings/{name}

A bad field is 422 naming it (the body's model); an endpoint the mapping names must exist (422
``unknown_endpoint`` naming it: a typo would grant nothing). The gateway applies a change within
its cache TTL (FABRIC_GATEWAY_CACHE_SECS).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from common.identity_mappings import IdentityMapping
from common.records import identity_mappings
from controlplane.api.answers import Deleted
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import gateway_config
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["identity"], dependencies=[Depends(require_admin)])


@router.post("/identity-mappings", status_code=201, response_model=IdentityMapping)
def put_mapping(body: IdentityMapping, state: StateDep, who: PrincipalDep) -> dict:
    return gateway_config.put_identity_mapping(state, who, body).model_dump(mode="json")


@router.get("/identity-mappings", response_model=list[IdentityMapping])
def list_mappings(state: StateDep) -> list[dict]:
    return [m.model_dump(mode="json") for m in identity_mappings.list(state.store)]


@router.get("/identity-mappings/{name}", response_model=IdentityMapping)
def get_mapping(name: str, state: StateDep) -> dict:
    return identity_mappings.require(state.store, name).model_dump(mode="json")


@router.delete("/identity-mappings/{name}", response_model=Deleted)
def delete_mapping(name: str, state: StateDep, who: PrincipalDep) -> dict:
    gateway_config.delete_identity_mapping(state, who, name)
    return {"kind": "identity-mapping", "name": name, "deleted": True}
