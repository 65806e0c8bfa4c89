"""Short-lived keys for the console's playground (controlplane.console.playground).

    POST   /api/ai/endpoints/{name}/playground-key         a key for the caller, shown this once
    DELETE /api/ai/endpoints/{name}/playground-key/{id}    revoke one the caller was given

Who gets one, how narrow it is and how many a caller may hold (403 ``playground_refused``, 429
``playground_keys_held``) is controlplane.ops.keys' create_playground; a caller revokes only its
own playground keys here (delete_playground).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from controlplane.api import keys as keys_api
from controlplane.api.answers import KeyDeleted, NewKey
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import keys as key_ops
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["keys"], dependencies=[Depends(require_admin)])


@router.post("/endpoints/{name}/playground-key", status_code=201, response_model=NewKey)
def create_playground_key(name: str, state: StateDep, who: PrincipalDep) -> dict:
    return keys_api.new_key(state, key_ops.create_playground(state, who, name))


@router.delete("/endpoints/{name}/playground-key/{key_id}", response_model=KeyDeleted)
def delete_playground_key(name: str, key_id: str, state: StateDep, who: PrincipalDep) -> dict:
    return keys_api.deleted(key_ops.delete_playground(state, who, name, key_id))
