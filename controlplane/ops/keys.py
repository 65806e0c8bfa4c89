"""Inference API key operations: create, rotate, delete (and resolve a key by id or name).

A name is unique per endpoint (409 already_exists; the exact claim is apikeys.save_new's
create-all). A key scoped to a model must name what the endpoint's deployment serves (422
model_not_served). A tenant-bound caller sees only its tenant's keys (others are absent, 404),
and a key it creates gets its tenant and must be on an endpoint of it (403 tenant_mismatch for a
key acting for another tenant than its endpoint's). The endpoint's key policy
(controlplane.tenancy.key_policies) is checked at create and rotate. Digests use
FABRIC_KEY_HMAC_SECRET(_FILE), read at start (503 no_hmac_secret when none is set), checked
after everything else so a refused create says why it was refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from common import apikeys
from common.errors import Conflict, Forbidden, InvalidInput, NotFound, TransientError
from common.records import deployments, endpoints, models
from common.schemas import DNS_LABEL, ApiKeyRecord, Spec
from controlplane.state import AppState
from controlplane.tenancy import key_policies, owners
from controlplane.tenancy.principal import Principal, claimed, visible

MAX_TTL_SECS = 10 * 365 * 86400


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


@dataclass(frozen=True)
class NewSecret:
    """A key just made or rotated and its plaintext, which the caller is shown this once."""
    record: ApiKeyRecord
    key: str


def hmac_secret(ctx: AppState) -> bytes:
    """FABRIC_KEY_HMAC_SECRET(_FILE), read at start (controlplane.settings); 503 when none is set."""
    config = ctx.settings
    if config.key_hmac_secret is None:
        raise TransientError(f"API keys are unavailable on this fabricd: {config.key_hmac_error}",
                             code="no_hmac_secret")
    return config.key_hmac_secret


def _shape(key) -> key_policies.KeyShape:
    """What the endpoint's key policy judges, from a create body or a stored record."""
    return key_policies.KeyShape(key.ttl_secs, key.model, key.tenant, key.request_quota)


def served_models(ctx: AppState, endpoint: dict) -> set[str]:
    """The model names a request through this endpoint can carry: its deployment's model and name,
    and the model's LoRA adapters."""
    dep = deployments.stored(ctx.store, str(endpoint.get("deployment", "")))
    if dep is None:
        return set()
    model = models.stored(ctx.store, str(dep.get("model", "")))
    adapters = {str(a.get("name", "")) for a in model.get("adapters", [])} if model else set()
    return {str(dep.get("model", "")), str(dep.get("name", "")), *adapters} - {""}


def resolve(ctx: AppState, caller: Principal, ref: str) -> ApiKeyRecord:
    """A key by id, else by name (unique per endpoint; the same name on two endpoints is ambiguous),
    among the keys `caller` may see."""
    try:
        record = apikeys.get_key(ctx.store, ref)
        if visible(caller, "key", owners.key_tenant(ctx.store, record)):
            return record
    except NotFound:
        pass
    named = [r for r in owners.keys_for(ctx.store, caller) if r.name == ref]
    if not named:
        raise NotFound(f"no key with id or name {ref!r}")
    if len(named) > 1:
        where = ", ".join(sorted(f"{r.id} (endpoint {r.endpoint})" for r in named))
        raise Conflict(f"key name {ref!r} is used on several endpoints: {where}; give the id", code="ambiguous")
    return named[0]


def create(ctx: AppState, caller: Principal, body: KeyCreate, owner: str | None = None) -> NewSecret:
    """A new key; ``owner``: the playground's user it is made for (never from a request body)."""
    body = claimed(body, caller)
    endpoint = endpoints.stored(ctx.store, body.endpoint)
    if endpoint is None or not visible(caller, "endpoint", endpoint.get("tenant")):
        raise NotFound(f"endpoint {body.endpoint!r} does not exist")
    ep_tenant = endpoint.get("tenant")
    if ep_tenant is not None and body.tenant not in (None, ep_tenant):
        # A key acts for its tenant (limits, audit, chargeback): never another than its endpoint's.
        raise Forbidden(f"tenant: endpoint {body.endpoint!r} belongs to tenant {ep_tenant!r}; its keys cannot act "
                        f"for tenant {body.tenant!r}", code="tenant_mismatch")
    if any(r.name == body.name and r.endpoint == body.endpoint for r in apikeys.list_keys(ctx.store)):
        # Fast path, and the guard for keys stored before the name index; the exact claim is
        # apikeys.save_new's create-all.
        raise Conflict(f"endpoint {body.endpoint!r} already has a key named {body.name!r}; rotate or delete it",
                       code="already_exists")
    if body.model is not None:
        served = served_models(ctx, endpoint)
        if body.model not in served:
            raise InvalidInput(f"model: endpoint {body.endpoint!r} serves {', '.join(sorted(served)) or 'nothing'}; "
                               f"a key scoped to {body.model!r} could never be used", code="model_not_served")
    key_policies.enforce(ctx.store, body.endpoint, _shape(body))
    spec = apikeys.KeySpec(**body.model_dump(), owner=owner)
    record, plaintext = apikeys.create_key(ctx.store, spec, hmac_secret(ctx))
    return NewSecret(record, plaintext)


def rotate(ctx: AppState, caller: Principal, ref: str, body: KeyRotate) -> NewSecret:
    """A new secret; the current one keeps working for body.overlap_secs."""
    current = resolve(ctx, caller, ref)
    key_policies.enforce(ctx.store, current.endpoint, _shape(current), rotating=True)
    record, plaintext = apikeys.rotate_key(ctx.store, current.id, hmac_secret(ctx), body.overlap_secs)
    return NewSecret(record, plaintext)


def renew(ctx: AppState, caller: Principal, ref: str) -> NewSecret:
    """A new secret living the key's ttl_secs from now; the current one works until its own expiry
    (apikeys.rotated's renew). For keys with a TTL only (an agent runtime's credential)."""
    current = resolve(ctx, caller, ref)
    if not current.ttl_secs:
        raise InvalidInput(f"key {current.name!r} never expires: rotate it instead of renewing", code="no_ttl")
    key_policies.enforce(ctx.store, current.endpoint, _shape(current), rotating=True)
    record, plaintext = apikeys.rotate_key(ctx.store, current.id, hmac_secret(ctx), renew=True)
    return NewSecret(record, plaintext)


def delete(ctx: AppState, caller: Principal, ref: str) -> ApiKeyRecord:
    record = resolve(ctx, caller, ref)
    apikeys.delete_key(ctx.store, record.id)
    return record
