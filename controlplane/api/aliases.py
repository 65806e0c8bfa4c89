"""Model aliases for the gateway's root ``/v1/...`` (common.model_aliases), admin only.

    POST   /api/ai/aliases          {name, endpoint, model_name?}: create or replace
    GET    /api/ai/aliases          every alias
    GET    /api/ai/aliases/{name}
    DELETE /api/ai/aliases/{name}

The endpoint must exist when the alias is made. An alias may not shadow a model a deployment
serves (409): a name means one thing to every client.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import ValidationError

from common.errors import InvalidInput, NotFound
from common.model_aliases import ModelAlias
from common.records import aliases
from controlplane.api.answers import NameDeleted
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import gateway_config
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["aliases"], dependencies=[Depends(require_admin)])


@router.post("/aliases", status_code=201, response_model=ModelAlias)
def put_alias(body: dict, state: StateDep, who: PrincipalDep) -> dict:
    try:
        alias = ModelAlias.model_validate({k: v for k, v in body.items() if k != "created_at"})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidInput(f"{where}: {first['msg']}", code="invalid_alias") from None
    return gateway_config.put_alias(state, who, alias).model_dump()


@router.get("/aliases", response_model=list[ModelAlias])
def list_aliases(state: StateDep) -> list[dict]:
    return [alias for _, alias in sorted(aliases.stored_items(state.store), key=lambda item: item[0])]


def _get(state, name: str):
    alias = aliases.stored(state.store, name)
    if alias is None:
        raise NotFound(f"no alias named {name!r}")
    return alias


@router.get("/aliases/{name:path}", response_model=ModelAlias)
def get_alias(name: str, state: StateDep) -> dict:
    return _get(state, name)


@router.delete("/aliases/{name:path}", response_model=NameDeleted)
def delete_alias(name: str, state: StateDep, who: PrincipalDep) -> dict:
    gateway_config.delete_alias(state, who, name)
    return {"name": name, "deleted": True}
