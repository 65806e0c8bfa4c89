"""Inference API keys (who may call each route: controlplane.tenancy.route_rules).

    POST   /api/ai/keys                 create; the answer holds the plaintext key, shown this once
    GET    /api/ai/keys                 every key (never a digest)
    GET    /api/ai/keys/{ref}
    DELETE /api/ai/keys/{ref}
    POST   /api/ai/keys/{ref}/rotate    {"overlap_secs": 3600}: a new secret; the current one
                                        keeps working for overlap_secs
    GET    /api/ai/audit/verify         recompute the gateway audit hash chain

{ref} is a key's id or its name; a name used on several endpoints is ambiguous (409, use the id).
A name is unique per endpoint (409 already_exists): the name is claimed through an index key
(keyspace.api_key_names) created in the same create-all transaction as the record, so of
concurrent creates of one name exactly one wins and the others write nothing. A key scoped to a model must name what the
endpoint's deployment serves (its model or its own name); any other scope could never match a
request, so it is refused at create (422 naming `model`). requests_used counts every key's
requests through the gateway, with or without a quota.

A tenant-bound caller sees only its tenant's keys (a key's own tenant, else its endpoint's):
others are absent (404), and a key it creates gets its tenant and must be on an endpoint of it.
An endpoint's key policy (controlplane.tenancy.key_policies) is checked at create and rotate.
Digests use FABRIC_KEY_HMAC_SECRET(_FILE) (common.apikeys); fabricd and every gateway must
share it. It is read at start and kept on the app state, never in a module global.
The checks and writes are controlplane.ops.keys'; these routes parse, call it and answer.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from common import apikeys, audit_chain, keyspace
from common.records import counters
from controlplane.api.answers import AuditCheck, KeyDeleted, KeyView, NewKey
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import keys as key_ops
from controlplane.ops.keys import KeyCreate, KeyRotate
from controlplane.state import AppState, StateDep
from controlplane.tenancy import owners

router = APIRouter(prefix="/api/ai", tags=["keys"], dependencies=[Depends(require_admin)])


def _usage(state: AppState, record) -> dict:
    view = apikeys.public_view(record)
    view["requests_used"] = counters.read(state.store, keyspace.counters(f"quota/{record.id}"))
    view["expired"] = apikeys.is_expired(record, time.time())
    return view


def new_key(state: AppState, made: key_ops.NewSecret) -> dict:
    """The answer to a create or rotate: the key's view and its plaintext, shown this once."""
    return {**_usage(state, made.record), "key": made.key}


def deleted(record) -> dict:
    return {"id": record.id, "name": record.name, "deleted": True}


@router.post("/keys", status_code=201, response_model=NewKey)
def create_key(body: KeyCreate, state: StateDep, who: PrincipalDep) -> dict:
    return new_key(state, key_ops.create(state, who, body))


@router.get("/keys", response_model=list[KeyView])
def list_keys(state: StateDep, who: PrincipalDep) -> list[dict]:
    return [_usage(state, r) for r in owners.keys_for(state.store, who)]


@router.get("/keys/{ref}", response_model=KeyView)
def get_key(ref: str, state: StateDep, who: PrincipalDep) -> dict:
    return _usage(state, key_ops.resolve(state, who, ref))


@router.delete("/keys/{ref}", response_model=KeyDeleted)
def delete_key(ref: str, state: StateDep, who: PrincipalDep) -> dict:
    return deleted(key_ops.delete(state, who, ref))


@router.post("/keys/{ref}/rotate", response_model=NewKey)
def rotate_key(ref: str, state: StateDep, who: PrincipalDep, body: KeyRotate | None = None) -> dict:
    return new_key(state, key_ops.rotate(state, who, ref, body or KeyRotate()))


@router.get("/audit/verify", response_model=AuditCheck)
def verify_audit(state: StateDep) -> dict:
    result = audit_chain.verify(state.store)
    return {"ok": result.ok, "rows": result.rows, "bad_seq": result.bad_seq, "reason": result.reason}
