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
share it. It is read on first use and kept on the app state, never in a module global.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from common import apikeys, audit_chain, counters, keyspace
from common.errors import Conflict, Forbidden, InvalidInput, NotFound, TransientError
from common.schemas import DNS_LABEL, ApiKeyRecord, Spec
from controlplane.api.answers import AuditCheck, KeyDeleted, KeyView, NewKey
from controlplane.auth import PrincipalDep, require_admin
from controlplane.records import deployments, endpoints, models
from controlplane.settings import of as settings_of
from controlplane.state import AppState, StateDep
from controlplane.tenancy import key_policies, owners
from controlplane.tenancy.principal import Principal, claimed, visible

MAX_TTL_SECS = 10 * 365 * 86400

router = APIRouter(prefix="/api/ai", tags=["keys"], dependencies=[Depends(require_admin)])


class KeyCreate(Spec):
    name: str = Field(..., min_length=1, max_length=128)
    endpoint: str = Field(..., pattern=DNS_LABEL.pattern, description="the endpoint's name (a DNS label)")
    model: str | None = None
    tenant: str | None = None
    ttl_secs: int = Field(0, ge=0, le=MAX_TTL_SECS, description="0 means the key never expires; at most 10 years")
    request_quota: int | None = Field(None, ge=1, le=10**15, description="lifetime requests")
    tokens_per_minute: int | None = Field(None, ge=1, le=10**12)
    max_concurrent: int | None = Field(None, ge=1, le=1_000_000)
    priority: Literal["low", "normal", "high"] | None = Field(None, description="band of calls without "
                                                                             "x-request-priority")
    fallbacks: list[Annotated[str, Field(pattern=DNS_LABEL.pattern)]] = Field(
        default_factory=list, max_length=8, description="external endpoints this key's prompts may leave the "
                                                        "cluster for")
    shadow_limits: list[Annotated[str, Field(pattern=apikeys.SHADOWABLE.pattern)]] = Field(
        default_factory=list, max_length=16, description="limits only reported for this key's calls, never refusing "
        "(shadow mode): request_quota, tokens_per_minute, max_concurrent or FABRIC_<LIMIT>")


class KeyRotate(Spec):
    overlap_secs: int = Field(apikeys.DEFAULT_OVERLAP_SECS, ge=0, le=30 * 86400)


def hmac_secret(request: Request) -> bytes:
    """FABRIC_KEY_HMAC_SECRET(_FILE), read at start (controlplane.settings); 503 when none is set."""
    config = settings_of(request.app.state.fabric)
    if config.key_hmac_secret is None:
        raise TransientError(f"API keys are unavailable on this fabricd: {config.key_hmac_error}",
                             code="no_hmac_secret")
    return config.key_hmac_secret


def _shape(key) -> key_policies.KeyShape:
    """What the endpoint's key policy judges, from a create body or a stored record."""
    return key_policies.KeyShape(key.ttl_secs, key.model, key.tenant, key.request_quota)


def _usage(state: AppState, record) -> dict:
    view = apikeys.public_view(record)
    view["requests_used"] = counters.read(state.store, keyspace.counters(f"quota/{record.id}"))
    view["expired"] = apikeys.is_expired(record, time.time())
    return view


def served_models(state: AppState, endpoint: dict) -> set[str]:
    """The model names a request through this endpoint can carry: its deployment's model and name,
    and the model's LoRA adapters."""
    dep = deployments.stored(state.store, str(endpoint.get("deployment", "")))
    if dep is None:
        return set()
    model = models.stored(state.store, str(dep.get("model", "")))
    adapters = {str(a.get("name", "")) for a in model.get("adapters", [])} if model else set()
    return {str(dep.get("model", "")), str(dep.get("name", "")), *adapters} - {""}


def resolve(state: AppState, ref: str, who: Principal) -> ApiKeyRecord:
    """A key by id, else by name (unique per endpoint; the same name on two endpoints is ambiguous),
    among the keys `who` may see."""
    try:
        record = apikeys.get_key(state.store, ref)
        if visible(who, "key", owners.key_tenant(state.store, record)):
            return record
    except NotFound:
        pass
    named = [r for r in owners.keys_for(state.store, who) if r.name == ref]
    if not named:
        raise NotFound(f"no key with id or name {ref!r}")
    if len(named) > 1:
        where = ", ".join(sorted(f"{r.id} (endpoint {r.endpoint})" for r in named))
        raise Conflict(f"key name {ref!r} is used on several endpoints: {where}; give the id", code="ambiguous")
    return named[0]


@router.post("/keys", status_code=201, response_model=NewKey)
def create_key(body: KeyCreate, request: Request, state: StateDep, who: PrincipalDep) -> dict:
    body = claimed(body, who)
    endpoint = endpoints.stored(state.store, body.endpoint)
    if endpoint is None or not visible(who, "endpoint", endpoint.get("tenant")):
        raise NotFound(f"endpoint {body.endpoint!r} does not exist")
    ep_tenant = endpoint.get("tenant")
    if ep_tenant is not None and body.tenant not in (None, ep_tenant):
        # A key acts for its tenant (limits, audit, chargeback): never another than its endpoint's.
        raise Forbidden(f"tenant: endpoint {body.endpoint!r} belongs to tenant {ep_tenant!r}; its keys cannot act "
                        f"for tenant {body.tenant!r}", code="tenant_mismatch")
    if any(r.name == body.name and r.endpoint == body.endpoint for r in apikeys.list_keys(state.store)):
        # Fast path, and the guard for keys stored before the name index; the exact claim is
        # apikeys.save_new's create-all.
        raise Conflict(f"endpoint {body.endpoint!r} already has a key named {body.name!r}; rotate or delete it",
                       code="already_exists")
    if body.model is not None:
        served = served_models(state, endpoint)
        if body.model not in served:
            raise InvalidInput(f"model: endpoint {body.endpoint!r} serves {', '.join(sorted(served)) or 'nothing'}; "
                               f"a key scoped to {body.model!r} could never be used", code="model_not_served")
    key_policies.enforce(state.store, body.endpoint, _shape(body))
    spec = apikeys.KeySpec(**body.model_dump())
    record, plaintext = apikeys.create_key(state.store, spec, hmac_secret(request))
    return {**_usage(state, record), "key": plaintext}


@router.get("/keys", response_model=list[KeyView])
def list_keys(state: StateDep, who: PrincipalDep) -> list[dict]:
    return [_usage(state, r) for r in owners.keys_for(state.store, who)]


@router.get("/keys/{ref}", response_model=KeyView)
def get_key(ref: str, state: StateDep, who: PrincipalDep) -> dict:
    return _usage(state, resolve(state, ref, who))


@router.delete("/keys/{ref}", response_model=KeyDeleted)
def delete_key(ref: str, state: StateDep, who: PrincipalDep) -> dict:
    record = resolve(state, ref, who)
    apikeys.delete_key(state.store, record.id)
    return {"id": record.id, "name": record.name, "deleted": True}


@router.post("/keys/{ref}/rotate", response_model=NewKey)
def rotate_key(ref: str, request: Request, state: StateDep, who: PrincipalDep,
               body: KeyRotate | None = None) -> dict:
    overlap = (body or KeyRotate()).overlap_secs
    current = resolve(state, ref, who)
    key_policies.enforce(state.store, current.endpoint, _shape(current), rotating=True)
    record, plaintext = apikeys.rotate_key(state.store, current.id, hmac_secret(request), overlap)
    return {**_usage(state, record), "key": plaintext}


@router.get("/audit/verify", response_model=AuditCheck)
def verify_audit(state: StateDep) -> dict:
    result = audit_chain.verify(state.store)
    return {"ok": result.ok, "rows": result.rows, "bad_seq": result.bad_seq, "reason": result.reason}
