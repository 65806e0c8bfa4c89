"""Inference API key operations: create, rotate, delete (and resolve a key by id or name).

A name is unique per endpoint (409 already_exists; the exact claim is api_keys.save_new's
create-all). A key scoped to a model must name what the endpoint's deployment serves (422
model_not_served). A tenant-bound caller sees only its tenant's keys (others are absent, 404),
and a key it creates gets its tenant and must be on an endpoint of it (403 tenant_mismatch for a
key acting for another tenant than its endpoint's). The endpoint's key policy
(controlplane.tenancy.key_policies) is checked at create and rotate. Digests use
FABRIC_KEY_HMAC_SECRET(_FILE), read at start (503 no_hmac_secret when none is set), checked
after everything else so a refused create says why it was refused.

Playground keys (the console's playground, create_playground): an operator or admin gets one for
any endpoint it sees (it could make the same key with create). A viewer gets one only where the
endpoint's key policy says ``viewer_playground: true``; otherwise 403 ``playground_refused``. A
caller holds at most MAX_LIVE_PER_CALLER live playground keys per endpoint (429
``playground_keys_held`` beyond), so a loop of creates cannot grow the store: each key takes one of
the caller's slots (common.records.playground_slots), so concurrent creates cannot all pass the
count; revoking the key frees its slot, expiry lets the lease drop it. Each create also deletes the
endpoint's expired playground keys. The key is the narrowest the endpoint allows: scoped to the
endpoint and its deployment's model, the endpoint's tenant, PLAYGROUND_REQUESTS requests, expiring
after PLAYGROUND_TTL_S (or the key policy's max_ttl_secs when shorter), and made through create, so
the key policy and every other create check apply. The caller is stored in the key's ``owner``
field (never read back from its name), which is how a caller may revoke only its own playground
keys (delete_playground).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from common import apikeys
from common.errors import Conflict, Forbidden, InvalidInput, LimitExceeded, NotFound, TransientError
from common.key_policies import MAX_TTL_SECS
from common.records import api_keys, deployments, endpoints, models, playground_slots
from common.schemas import DNS_LABEL, ApiKeyRecord, Spec
from controlplane.state import AppState
from controlplane.tenancy import key_policies, owners
from controlplane.tenancy.principal import VIEWER, Principal, claimed, visible

PLAYGROUND_TTL_S = 900
PLAYGROUND_REQUESTS = 20
MAX_LIVE_PER_CALLER = 4  # live playground keys one caller may hold on one endpoint: a loop cannot grow the store
PLAYGROUND_PREFIX = "console-try-"


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
        record = api_keys.get(ctx.store, ref)
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
    if any(r.name == body.name and r.endpoint == body.endpoint for r in api_keys.list(ctx.store)):
        # Fast path, and the guard for keys stored before the name index; the exact claim is
        # api_keys.save_new's create-all.
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
    api_keys.delete(ctx.store, record.id)
    return record


def _purge_expired_playground(ctx: AppState, endpoint: str, now: float) -> None:
    """Delete the endpoint's expired playground keys, and free their slots."""
    gone = set()
    for k in api_keys.list(ctx.store):
        if k.endpoint == endpoint and k.owner is not None and apikeys.is_expired(k, now):
            api_keys.delete(ctx.store, k.id)
            gone.add(k.id)
    if gone:
        playground_slots.free(ctx.store, endpoint, gone)


def create_playground(ctx: AppState, caller: Principal, endpoint: str) -> NewSecret:
    """A short-lived key on ``endpoint`` for ``caller`` (the module's docstring says which)."""
    ep = endpoints.get(ctx.store, endpoint)
    if ep is None:
        raise NotFound(f"endpoint {endpoint!r} does not exist")
    policy = key_policies.load(ctx.store, endpoint)
    if caller.role == VIEWER and not (policy is not None and policy.viewer_playground):
        raise Forbidden(f"viewers may not use endpoint {endpoint!r}'s playground: its key policy does not set "
                        f"viewer_playground (an admin can: fabricctl ai key-policy set {endpoint} "
                        "--viewer-playground)", code="playground_refused")
    _purge_expired_playground(ctx, endpoint, time.time())
    dep = deployments.get(ctx.store, ep.deployment)
    ttl = min(PLAYGROUND_TTL_S, policy.max_ttl_secs or PLAYGROUND_TTL_S) if policy else PLAYGROUND_TTL_S
    slot = playground_slots.take(ctx.store, endpoint, caller.subject, MAX_LIVE_PER_CALLER, ttl)
    if slot is None:
        raise LimitExceeded(f"you hold {MAX_LIVE_PER_CALLER} live playground keys for endpoint {endpoint!r} (at "
                            f"most {MAX_LIVE_PER_CALLER}); each is revoked after its call or expires", retry_after=60,
                            code="playground_keys_held")
    quota = min(PLAYGROUND_REQUESTS, policy.max_request_quota or PLAYGROUND_REQUESTS) if policy else PLAYGROUND_REQUESTS
    body = KeyCreate(name=f"{PLAYGROUND_PREFIX}{caller.subject[:40]}-{secrets.token_hex(4)}", endpoint=endpoint,
                     model=dep.model if dep is not None else None, tenant=ep.tenant, ttl_secs=ttl,
                     request_quota=quota)
    # The create's own checks run as an operator of the caller's tenant: the viewer role is the
    # one thing a playground key lifts, and only for this key.
    acting = caller if caller.role != VIEWER else Principal(caller.subject, "operator", caller.tenant)
    try:
        made = create(ctx, acting, body, owner=caller.subject)
    except Exception:
        playground_slots.give_back(ctx.store, slot)  # the slot goes back when no key was made
        raise
    playground_slots.hold(ctx.store, slot, made.record.id)
    return made


def delete_playground(ctx: AppState, caller: Principal, endpoint: str, ref: str) -> ApiKeyRecord:
    """Revoke one of ``caller``'s own playground keys on ``endpoint`` (404 for any other key) and
    free its slot."""
    try:
        record = resolve(ctx, caller, ref)
    except NotFound:
        record = None
    if record is None or record.endpoint != endpoint or record.owner != caller.subject:
        raise NotFound(f"endpoint {endpoint!r} has no playground key {ref!r} of yours")
    deleted = delete(ctx, caller, record.id)
    playground_slots.free(ctx.store, endpoint, {deleted.id}, caller.subject)
    return deleted
