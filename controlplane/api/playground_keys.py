"""Short-lived keys for the console's playground (controlplane.console.playground).

    POST   /api/ai/endpoints/{name}/playground-key         a key for the caller, shown this once
    DELETE /api/ai/endpoints/{name}/playground-key/{id}    revoke one the caller was given

An operator or admin gets one for any endpoint it sees (it could make the same key with
POST /api/ai/keys). A viewer gets one only where the endpoint's key policy says
``viewer_playground: true`` (PUT /api/ai/key-policies/{name}); otherwise 403 ``playground_refused``.
A caller holds at most MAX_LIVE_PER_CALLER live playground keys per endpoint (429 beyond), so a
loop of creates cannot grow the store. The key is the narrowest the endpoint allows: scoped to the endpoint and its deployment's model,
the endpoint's tenant, PLAYGROUND_REQUESTS requests, expiring after PLAYGROUND_TTL_S (or the key
policy's max_ttl_secs when shorter). It is made through the keys' own create operation
(controlplane.ops.keys.create), so the key policy and every other create check apply. Its name, ``console-try-{caller}-{8 hex}``, is how a
caller may revoke only its own playground keys here.
"""

from __future__ import annotations

import re
import secrets
import time

from fastapi import APIRouter, Depends

from common import apikeys
from common.errors import Forbidden, LimitExceeded, NotFound
from controlplane.api import keys as keys_api
from controlplane.api.answers import KeyDeleted, NewKey
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import keys as key_ops
from controlplane.records import deployments, endpoints
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


def _mine(name: str, subject: str) -> bool:
    return re.fullmatch(re.escape(key_name_prefix(subject)) + "[0-9a-f]{8}", name) is not None


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
    now = time.time()
    live = [k for k in apikeys.list_keys(state.store)
            if k.endpoint == name and _mine(k.name, who.subject) and not apikeys.is_expired(k, now)]
    if len(live) >= MAX_LIVE_PER_CALLER:
        raise LimitExceeded(f"you hold {len(live)} live playground keys for endpoint {name!r} (at most "
                            f"{MAX_LIVE_PER_CALLER}); each is revoked after its call or expires", retry_after=60,
                            code="playground_keys_held")
    dep = deployments.get(state.store, ep.deployment)
    ttl = min(PLAYGROUND_TTL_S, policy.max_ttl_secs or PLAYGROUND_TTL_S) if policy else PLAYGROUND_TTL_S
    quota = min(PLAYGROUND_REQUESTS, policy.max_request_quota or PLAYGROUND_REQUESTS) if policy else PLAYGROUND_REQUESTS
    body = key_ops.KeyCreate(name=key_name_prefix(who.subject) + secrets.token_hex(4), endpoint=name,
                             model=dep.model if dep is not None else None, tenant=ep.tenant,
                             ttl_secs=ttl, request_quota=quota)
    # The create's own checks run as an operator of the caller's tenant: the viewer role is the
    # one thing this route lifts, and only for this key.
    acting = who if who.role != VIEWER else Principal(who.subject, "operator", who.tenant)
    return keys_api.new_key(state, key_ops.create(state, acting, body))


@router.delete("/endpoints/{name}/playground-key/{key_id}", response_model=KeyDeleted)
def delete_playground_key(name: str, key_id: str, state: StateDep, who: PrincipalDep) -> dict:
    try:
        record = key_ops.resolve(state, who, key_id)
    except NotFound:
        record = None
    if record is None or record.endpoint != name or not _mine(record.name, who.subject):
        raise NotFound(f"endpoint {name!r} has no playground key {key_id!r} of yours")
    return keys_api.deleted(key_ops.delete(state, who, record.id))
