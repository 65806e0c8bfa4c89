"""Inference API keys, admin only.

    POST   /api/ai/keys                 create; the answer holds the plaintext key, shown this once
    GET    /api/ai/keys                 every key (never a digest)
    GET    /api/ai/keys/{id}
    DELETE /api/ai/keys/{id}
    POST   /api/ai/keys/{id}/rotate     {"overlap_secs": 3600}: a new secret; the current one
                                        keeps working for overlap_secs
    GET    /api/ai/audit/verify         recompute the gateway audit hash chain

Digests use FABRIC_KEY_HMAC_SECRET(_FILE) (common.apikeys); fabricd and every gateway must
share it. It is read on first use and kept on the app state, never in a module global.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from common import apikeys, audit_chain, counters, keyspace
from common.errors import NotFound, TransientError
from common.schemas import check_name
from controlplane.auth import require_admin
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["keys"], dependencies=[Depends(require_admin)])


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., min_length=1, max_length=128)
    endpoint: str
    model: str | None = None
    tenant: str | None = None
    ttl_secs: int = Field(0, ge=0, description="0 means the key never expires")
    request_quota: int | None = Field(None, ge=1, description="lifetime requests")
    tokens_per_minute: int | None = Field(None, ge=1)
    max_concurrent: int | None = Field(None, ge=1)


class KeyRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overlap_secs: int = Field(apikeys.DEFAULT_OVERLAP_SECS, ge=0, le=30 * 86400)


def hmac_secret(request: Request) -> bytes:
    secret = getattr(request.app.state, "key_hmac_secret", None)
    if secret is None:
        try:
            secret = apikeys.load_hmac_secret()
        except apikeys.HmacSecretError as exc:
            raise TransientError(f"API keys are unavailable on this fabricd: {exc}", code="no_hmac_secret") from None
        request.app.state.key_hmac_secret = secret
    return secret


def _usage(state: AppState, record) -> dict:
    view = apikeys.public_view(record)
    view["requests_used"] = counters.read(state.store, keyspace.counters(f"quota/{record.id}"))
    view["expired"] = apikeys.is_expired(record, time.time())
    return view


@router.post("/keys", status_code=201)
def create_key(body: KeyCreate, request: Request, state: StateDep) -> dict:
    check_name(body.endpoint, "endpoint")
    if state.store.get(keyspace.endpoints(body.endpoint)) is None:
        raise NotFound(f"endpoint {body.endpoint!r} does not exist")
    spec = apikeys.KeySpec(**body.model_dump())
    record, plaintext = apikeys.create_key(state.store, spec, hmac_secret(request))
    return {**_usage(state, record), "key": plaintext}


@router.get("/keys")
def list_keys(state: StateDep) -> list[dict]:
    return [_usage(state, r) for r in apikeys.list_keys(state.store)]


@router.get("/keys/{key_id}")
def get_key(key_id: str, state: StateDep) -> dict:
    return _usage(state, apikeys.get_key(state.store, key_id))


@router.delete("/keys/{key_id}")
def delete_key(key_id: str, state: StateDep) -> dict:
    apikeys.delete_key(state.store, key_id)
    return {"id": key_id, "deleted": True}


@router.post("/keys/{key_id}/rotate")
def rotate_key(key_id: str, request: Request, state: StateDep, body: KeyRotate | None = None) -> dict:
    overlap = (body or KeyRotate()).overlap_secs
    record, plaintext = apikeys.rotate_key(state.store, key_id, hmac_secret(request), overlap)
    return {**_usage(state, record), "key": plaintext}


@router.get("/audit/verify")
def verify_audit(state: StateDep) -> dict:
    result = audit_chain.verify(state.store)
    return {"ok": result.ok, "rows": result.rows, "bad_seq": result.bad_seq, "reason": result.reason}
