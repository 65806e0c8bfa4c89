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

from common import keyspace
from common.errors import NotFound
from common.schemas import ModelArtifact, Node, Site, Spec, check_name
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
    kv = state.store.get(keyspace.models(name))
    if kv is None:
        raise NotFound(f"model {name!r} not found")
    return ModelArtifact.model_validate_json(kv.value, context={"stored": True})


@router.post("/models/{name}/replicate")
def replicate_model(name: str, body: ReplicateRequest, state: StateDep) -> dict:
    model = _model(state, name)
    kv = state.store.get(keyspace.sites(body.site))
    site = Site.model_validate_json(kv.value) if kv is not None else None
    nodes = [Node.model_validate_json(n.value) for n in state.store.list(keyspace.nodes())]
    decision = replicate.decide(model, body.site, site, nodes, time.time())
    copy = replicate.SiteCopy(model=name, site=body.site, phase="Pending", message=decision.message,
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
    copy = replicate.record(state.store, copy)
    record_event(state.store, "model", name, "Replicated" if copy.phase == "Ready" else "ReplicatePending",
                 f"site {body.site}: {copy.message}", tenant=model.tenant, keep=state.settings.events_kept,
                 max_age_s=state.settings.events_max_age_s, type="Normal" if copy.phase == "Ready" else "Warning")
    return copy.model_dump(mode="json")


@router.get("/models/{name}/sites")
def model_sites(name: str, state: StateDep) -> list[dict]:
    _model(state, name)
    return [c.model_dump(mode="json") for c in replicate.list_copies(state.store, name)]
