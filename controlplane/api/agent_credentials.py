"""Agent Runtime credentials: a scoped, short-lived inference key and the base URL an agent
runtime calls (docs/gateway.md "Agent Runtime credentials").

    POST   /api/ai/endpoints/{name}/credentials                  {"runtime": "NAME", "ttl_secs": 900}
    POST   /api/ai/endpoints/{name}/credentials/{key_id}/refresh  the next secret, before this one expires
    DELETE /api/ai/endpoints/{name}/credentials/{key_id}          revoke: the gateway refuses it from then on

A credential is an ordinary API key (controlplane.ops.keys: the key policy and every create check
apply) named ``agent-runtime-{runtime}``, scoped to the one endpoint and acting for its tenant,
with a TTL (60 s to 1 day). The answer carries the environment the runtime reads:
``FABRIC_INFERENCE_BASE`` (the gateway's URL for this endpoint, from FABRIC_CONSOLE_GATEWAY_URL,
the gateway clients use; 503 ``no_gateway`` when it is not set) and ``FABRIC_AI_API_KEY``, and
``refresh_after`` (two thirds of the TTL). A refresh issues a new secret living ``ttl_secs`` from
now while the current one keeps working until its own expiry (common.apikeys.rotated's renew), so
a runtime that rereads its credential (``fabricctl ai credential issue --env-file F --watch``
rewrites F) never restarts and never holds a dead one. The gateway checks the key as any key:
this endpoint only, refused after ``expires_at`` or once deleted.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from common.errors import NotFound, TransientError
from common.records import endpoints
from common.schemas import DNS_LABEL, Spec
from controlplane.api.answers import KeyDeleted
from controlplane.api.keys import deleted
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import keys as key_ops
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["keys"], dependencies=[Depends(require_admin)])
NAME_PREFIX = "agent-runtime-"
MIN_TTL_S, MAX_TTL_S, DEFAULT_TTL_S = 60, 86400, 900


class CredentialRequest(Spec):
    runtime: str = Field(..., pattern=DNS_LABEL.pattern, max_length=48,
                         description="the agent runtime's name (a DNS label); one credential per runtime and endpoint")
    ttl_secs: int = Field(DEFAULT_TTL_S, ge=MIN_TTL_S, le=MAX_TTL_S,
                          description=f"how long each secret lives, {MIN_TTL_S}-{MAX_TTL_S} s")


class AgentCredential(BaseModel):
    id: str = Field(..., description="the key's id: refresh and revoke name it")
    name: str
    endpoint: str
    tenant: str | None
    expires_at: float
    refresh_after: float = Field(..., description="refresh from then on; the current secret works until expires_at")
    inference_base: str = Field(..., description="FABRIC_INFERENCE_BASE: the gateway's OpenAI base for the endpoint")
    key: str = Field(..., description="FABRIC_AI_API_KEY: the secret, shown this once")
    env: dict[str, str] = Field(..., description="the variables an agent runtime reads")


def _base(state: AppState, endpoint: str) -> str:
    gateway = state.settings.gateway_url
    if not gateway:
        raise TransientError("this fabricd does not know the gateway clients use: set FABRIC_CONSOLE_GATEWAY_URL "
                             "(docs/console.md) to give agent runtimes an inference base", code="no_gateway")
    return f"{gateway}/api/ai/openai/{endpoint}/v1"


def _answer(made: key_ops.NewSecret, base: str) -> AgentCredential:
    rec = made.record
    expires = float(rec.expires_at or time.time())
    return AgentCredential(id=rec.id, name=rec.name, endpoint=rec.endpoint, tenant=rec.tenant, expires_at=expires,
                           refresh_after=expires - rec.ttl_secs / 3, inference_base=base, key=made.key,
                           env={"FABRIC_INFERENCE_BASE": base, "FABRIC_AI_API_KEY": made.key})


def _credential(state: AppState, who, endpoint: str, key_id: str):
    try:
        record = key_ops.resolve(state, who, key_id)
    except NotFound:
        record = None
    if record is None or record.endpoint != endpoint or not record.name.startswith(NAME_PREFIX):
        raise NotFound(f"endpoint {endpoint!r} has no agent runtime credential {key_id!r}")
    return record


@router.post("/endpoints/{name}/credentials", status_code=201, response_model=AgentCredential)
def issue(name: str, body: CredentialRequest, state: StateDep, who: PrincipalDep) -> AgentCredential:
    ep = endpoints.get(state.store, name)
    if ep is None:
        raise NotFound(f"endpoint {name!r} does not exist")
    base = _base(state, name)
    made = key_ops.create(state, who, key_ops.KeyCreate(name=NAME_PREFIX + body.runtime, endpoint=name,
                                                        tenant=ep.tenant, ttl_secs=body.ttl_secs))
    return _answer(made, base)


@router.post("/endpoints/{name}/credentials/{key_id}/refresh", response_model=AgentCredential)
def refresh(name: str, key_id: str, state: StateDep, who: PrincipalDep) -> AgentCredential:
    record = _credential(state, who, name, key_id)
    base = _base(state, name)
    return _answer(key_ops.renew(state, who, record.id), base)


@router.delete("/endpoints/{name}/credentials/{key_id}", response_model=KeyDeleted)
def revoke(name: str, key_id: str, state: StateDep, who: PrincipalDep) -> dict:
    record = _credential(state, who, name, key_id)
    return deleted(key_ops.delete(state, who, record.id))
