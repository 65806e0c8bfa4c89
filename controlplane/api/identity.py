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

from common.errors import InvalidInput
from common.identity_mappings import IdentityMapping
from controlplane.api.answers import Deleted
from controlplane.auth import require_admin
from controlplane.events import record_event
from controlplane.records import endpoints, identity_mappings
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["identity"], dependencies=[Depends(require_admin)])


def _event(state: AppState, name: str, action: str, message: str) -> None:
    record_event(state.store, "identity-mapping", name, action, message, keep=state.settings.events_kept,
                 max_age_s=state.settings.events_max_age_s)


@router.post("/identity-mappings", status_code=201, response_model=IdentityMapping)
def put_mapping(body: IdentityMapping, state: StateDep) -> dict:
    missing = [e for e in body.endpoints if e != "*" and not endpoints.exists(state.store, e)]
    if missing:
        raise InvalidInput(f"endpoints: no endpoint named {', '.join(repr(e) for e in missing)}",
                           code="unknown_endpoint")
    mapping = identity_mappings.put(state.store, body)
    _event(state, mapping.name, "updated", f"identity mapping {mapping.name}: {mapping.claim} holds "
           f"{mapping.value!r} -> endpoints {', '.join(mapping.endpoints) or '-'}, tenant {mapping.tenant or '-'}")
    return mapping.model_dump(mode="json")


@router.get("/identity-mappings", response_model=list[IdentityMapping])
def list_mappings(state: StateDep) -> list[dict]:
    return [m.model_dump(mode="json") for m in identity_mappings.list(state.store)]


@router.get("/identity-mappings/{name}", response_model=IdentityMapping)
def get_mapping(name: str, state: StateDep) -> dict:
    return identity_mappings.require(state.store, name).model_dump(mode="json")


@router.delete("/identity-mappings/{name}", response_model=Deleted)
def delete_mapping(name: str, state: StateDep) -> dict:
    identity_mappings.delete(state.store, name)
    _event(state, name, "deleted", f"identity mapping {name} deleted")
    return {"kind": "identity-mapping", "name": name, "deleted": True}
