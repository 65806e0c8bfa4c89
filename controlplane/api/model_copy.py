"""Site-to-site model copy, the sending side (controlplane.models.replicate; docs/models.md):

    POST /api/ai/models/{name}/replicate {"site": "S"}   make the model's bytes present at S; answers
                                                         the record: Ready, or Pending with the reason
    GET  /api/ai/models/{name}/sites                     every site's record for the model

The POST returns when the copy is done or refused (a push runs inside the request). Each outcome
is an event on the model (the reason, never the token).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from pydantic import field_validator

from common.records import model_sites as site_copies
from common.records import models, sites
from common.records import nodes as node_records
from common.schemas import ModelArtifact, Spec, check_name
from controlplane.auth import require_admin
from controlplane.events import record_event
from controlplane.models import replicate
from controlplane.settings import of as settings_of
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["models"], dependencies=[Depends(require_admin)])


class ReplicateRequest(Spec):
    site: str

    @field_validator("site")
    @classmethod
    def _site(cls, v: str) -> str:
        return check_name(v, "site")


def _model(state, name: str) -> ModelArtifact:
    return models.require(state.store, name)


@router.post("/models/{name}/replicate", response_model=site_copies.SiteCopy)
def replicate_model(name: str, body: ReplicateRequest, state: StateDep) -> dict:
    model = _model(state, name)
    site = sites.get(state.store, body.site)
    nodes = node_records.list(state.store)
    decision = replicate.decide(model, body.site, site, nodes, time.time())
    copy = site_copies.SiteCopy(model=name, site=body.site, phase="Pending", message=decision.message,
                              digest=decision.digest)
    if decision.action == "ready":
        copy = copy.model_copy(update={"phase": "Ready", "via": "node"})
    elif decision.action == "push":
        try:
            config = settings_of(state)
            digest = replicate.push(model, decision.digest, site.peer_url, config.replicate_token, config.model_dir)
            copy = copy.model_copy(update={"phase": "Ready", "via": "peer", "digest": digest,
                                           "message": f"copied to {site.peer_url} (digest {digest[:12]})"})
        except replicate.PushFailed as exc:
            copy = copy.model_copy(update={"message": exc.message})
    copy = site_copies.record(state.store, copy)
    record_event(state.store, "model", name, "Replicated" if copy.phase == "Ready" else "ReplicatePending",
                 f"site {body.site}: {copy.message}", tenant=model.tenant, keep=state.settings.events_kept,
                 max_age_s=state.settings.events_max_age_s, type="Normal" if copy.phase == "Ready" else "Warning")
    return copy.model_dump(mode="json")


@router.get("/models/{name}/sites", response_model=list[site_copies.SiteCopy])
def model_sites(name: str, state: StateDep) -> list[dict]:
    _model(state, name)
    return [c.model_dump(mode="json") for c in site_copies.list_copies(state.store, name)]
