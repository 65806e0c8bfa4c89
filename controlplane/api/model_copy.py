"""Site-to-site model copy, the sending side (controlplane.models.replicate; docs/models.md):

    POST /api/ai/models/{name}/replicate {"site": "S"}   make the model's bytes present at S; answers
                                                         the record: Ready, or Pending with the reason
    GET  /api/ai/models/{name}/sites                     every site's record for the model

The POST returns when the copy is done or refused (a push runs inside the request). Each outcome
is an event on the model (the reason, never the token).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import field_validator

from common.records import model_sites as site_copies
from common.records import models
from common.schemas import Spec, check_name
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import models as model_ops
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["models"], dependencies=[Depends(require_admin)])


class ReplicateRequest(Spec):
    site: str

    @field_validator("site")
    @classmethod
    def _site(cls, v: str) -> str:
        return check_name(v, "site")


@router.post("/models/{name}/replicate", response_model=site_copies.SiteCopy)
def replicate_model(name: str, body: ReplicateRequest, state: StateDep, who: PrincipalDep) -> dict:
    return model_ops.replicate(state, who, name, body.site).model_dump(mode="json")


@router.get("/models/{name}/sites", response_model=list[site_copies.SiteCopy])
def model_sites(name: str, state: StateDep) -> list[dict]:
    models.require(state.store, name)
    return [c.model_dump(mode="json") for c in site_copies.list_copies(state.store, name)]
