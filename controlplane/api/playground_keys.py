"""Short-lived keys for the console's playground (controlplane.console.playground).

    POST   /api/ai/endpoints/{name}/playground-key         a key for the caller, shown this once
    DELETE /api/ai/endpoints/{name}/playground-key/{id}    revoke one the caller was given

An operator or admin gets one for any endpoint it sees (it could make the same key with
POST /api/ai/keys). A viewer gets one only where the endpoint's key policy says
``viewer_playground: true`` (PUT /api/ai/key-policies/{name}); otherwise 403 ``playground_refused``.
A caller holds at most MAX_LIVE_PER_CALLER live playground keys per endpoint (429 beyond), so a
loop of creates cannot grow the store: each key takes one of the caller's slots
(keyspace.playground_slots, create-if-absent under a store lease as long as the key lives), so
concurrent creates cannot all pass the count; revoking the key frees its slot, expiry lets the
lease drop it. Each create also deletes the endpoint's expired playground keys. The key is the
narrowest the endpoint allows: scoped to the endpoint and its deployment's model, the endpoint's
tenant, PLAYGROUND_REQUESTS requests, expiring after PLAYGROUND_TTL_S (or the key policy's
max_ttl_secs when shorter). It is made through the keys' own create operation
(controlplane.ops.keys.create), so the key policy and every other create check apply. The
caller is stored in the key's ``owner`` field (never read back from its name), which is how a
caller may revoke only its own playground keys here.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from fastapi import APIRouter, Depends

from common import apikeys, keyspace
from common.errors import Forbidden, LimitExceeded, NotFound
from common.records import deployments, endpoints
from controlplane.api import keys as keys_api
from controlplane.api.answers import KeyDeleted, NewKey
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import keys as key_ops
from controlplane.state import StateDep
from controlplane.tenancy import key_policies
from controlplane.tenancy.principal import VIEWER, Principal

router = APIRouter(prefix="/api/ai", tags=["keys"], dependencies=[Depends(require_admin)])
PLAYGROUND_TTL_S = 900
PLAYGROUND_REQUESTS = 20
MAX_LIVE_PER_CALLER = 4  # live playground keys one caller may hold on one endpoint: a loop cannot grow the store
NAME_PREFIX = "console-try-"


def key_name_prefix(subject: str) -> str:
    return f"{NAME_PREFIX}{subject[:40]}-"


def _slots(endpoint: str, subject: str) -> str:
    return keyspace.playground_slots(endpoint, hashlib.sha256(subject.encode()).hexdigest()[:32])


def _take_slot(store, endpoint: str, subject: str, ttl: int) -> tuple[str, int] | None:
    """One of the caller's MAX_LIVE_PER_CALLER slots, taken atomically (create-if-absent) under a
    lease that outlives the key a little: (its key, the lease); None when all are held."""
    lease = store.grant_lease(ttl + 60)
    for i in range(MAX_LIVE_PER_CALLER):
        slot = f"{_slots(endpoint, subject)}{i}"
        if store.create(slot, "", lease=lease.id):
            return slot, lease.id
    store.revoke_lease(lease.id)
    return None


def _purge_expired(store, endpoint: str, now: float) -> None:
    """Delete the endpoint's expired playground keys, and free their slots."""
    gone = set()
    for k in apikeys.list_keys(store):
        if k.endpoint == endpoint and k.owner is not None and apikeys.is_expired(k, now):
            apikeys.delete_key(store, k.id)
            gone.add(k.id)
    if gone:
        for kv in store.list(keyspace.playground_slots(endpoint)):
            if kv.value in gone:
                store.delete(kv.key)


@router.post("/endpoints/{name}/playground-key", status_code=201, response_model=NewKey)
def create_playground_key(name: str, state: StateDep, who: PrincipalDep) -> dict:
    ep = endpoints.get(state.store, name)
    if ep is None:
        raise NotFound(f"endpoint {name!r} does not exist")
    policy = key_policies.load(state.store, name)
    if who.role == VIEWER and not (policy is not None and policy.viewer_playground):
        raise Forbidden(f"viewers may not use endpoint {name!r}'s playground: its key policy does not set "
                        f"viewer_playground (an admin can: fabricctl ai key-policy set {name} --viewer-playground)",
                        code="playground_refused")
    _purge_expired(state.store, name, time.time())
    dep = deployments.get(state.store, ep.deployment)
    ttl = min(PLAYGROUND_TTL_S, policy.max_ttl_secs or PLAYGROUND_TTL_S) if policy else PLAYGROUND_TTL_S
    taken = _take_slot(state.store, name, who.subject, ttl)
    if taken is None:
        raise LimitExceeded(f"you hold {MAX_LIVE_PER_CALLER} live playground keys for endpoint {name!r} (at most "
                            f"{MAX_LIVE_PER_CALLER}); each is revoked after its call or expires", retry_after=60,
                            code="playground_keys_held")
    quota = min(PLAYGROUND_REQUESTS, policy.max_request_quota or PLAYGROUND_REQUESTS) if policy else PLAYGROUND_REQUESTS
    body = key_ops.KeyCreate(name=key_name_prefix(who.subject) + secrets.token_hex(4), endpoint=name,
                             model=dep.model if dep is not None else None, tenant=ep.tenant,
                             ttl_secs=ttl, request_quota=quota)
    # The create's own checks run as an operator of the caller's tenant: the viewer role is the
    # one thing this route lifts, and only for this key.
    acting = who if who.role != VIEWER else Principal(who.subject, "operator", who.tenant)
    slot, lease = taken
    try:
        made = key_ops.create(state, acting, body, owner=who.subject)
    except Exception:
        state.store.delete(slot)  # the slot goes back when no key was made
        raise
    state.store.put(slot, made.record.id, lease=lease)  # names its key, so revoking frees it
    return keys_api.new_key(state, made)


@router.delete("/endpoints/{name}/playground-key/{key_id}", response_model=KeyDeleted)
def delete_playground_key(name: str, key_id: str, state: StateDep, who: PrincipalDep) -> dict:
    try:
        record = key_ops.resolve(state, who, key_id)
    except NotFound:
        record = None
    if record is None or record.endpoint != name or record.owner != who.subject:
        raise NotFound(f"endpoint {name!r} has no playground key {key_id!r} of yours")
    answer = keys_api.deleted(key_ops.delete(state, who, record.id))
    for kv in state.store.list(_slots(name, who.subject)):
        if kv.value == record.id:
            state.store.delete(kv.key)  # its slot is free again
    return answer
