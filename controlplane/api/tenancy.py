"""Users, tenant policies, key policies and admission (who may call each: tenancy/route_rules.py).

    POST   /api/ai/users                 {"name", "role", "tenant", "password"} (admin); never echoes it
    GET    /api/ai/users[/{name}]        without password hashes (admin)
    DELETE /api/ai/users/{name}          (admin); tokens already issued live until they expire
    POST   /api/ai/policies              a tenant's deploy policy, replacing its last (admin)
    GET    /api/ai/policies              every policy; a tenant-bound caller sees its own
    PUT    /api/ai/key-policies/{endpoint}   the endpoint's key policy (admin)
    GET    /api/ai/key-policies/{endpoint}   404 when it has none
    POST   /api/ai/admit                 a deployment body or an AdmissionReview: would it be admitted?
    POST   /api/ai/admit/{token}         the same without a user token, when FABRIC_ADMIT_TOKEN is set;
                                         any other token (or none set) is 404, compared in constant time
The writes (and their events, a deleted user's token revocation) are controlplane.ops.tenancy's.
"""

from __future__ import annotations

import hmac
import os

from fastapi import APIRouter, Body, Depends, Request

from common.errors import NotFound
from common.key_policies import KeyPolicy, KeyPolicyBody
from common.tenant_policies import TenantPolicy
from controlplane.api.answers import AdmissionReviewAnswer, AdmitVerdict, Deleted, UserView
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import tenancy as tenancy_ops
from controlplane.state import AppState, StateDep
from controlplane.tenancy import admit, key_policies, policies, users
from controlplane.tenancy.principal import Principal, claimed_tenant

router = APIRouter(prefix="/api/ai", tags=["tenancy"], dependencies=[Depends(require_admin)])
webhook = APIRouter(prefix="/api/ai", tags=["tenancy"])
public_routers = (webhook,)


# -- users -------------------------------------------------------------------------------------------

@router.post("/users", status_code=201, response_model=UserView)
def create_user(body: users.UserCreate, state: StateDep, who: PrincipalDep) -> dict:
    return tenancy_ops.create_user(state, who, body).public()


@router.get("/users", response_model=list[UserView])
def list_users(state: StateDep) -> list[dict]:
    return [u.public() for u in users.list_all(state.store)]


@router.get("/users/{name}", response_model=UserView)
def get_user(name: str, state: StateDep) -> dict:
    record = users.get(state.store, name)
    if record is None:
        raise NotFound(f"user {name!r} not found")
    return record.public()


@router.delete("/users/{name}", response_model=Deleted)
def delete_user(name: str, state: StateDep, who: PrincipalDep) -> dict:
    tenancy_ops.delete_user(state, who, name)
    return {"kind": "user", "name": name, "deleted": True}


# -- tenant policies ---------------------------------------------------------------------------------

@router.post("/policies", status_code=201, response_model=TenantPolicy)
def put_policy(body: TenantPolicy, state: StateDep, who: PrincipalDep) -> dict:
    return tenancy_ops.set_policy(state, who, body).model_dump(mode="json")


@router.get("/policies", response_model=list[TenantPolicy])
def list_policies(state: StateDep, who: PrincipalDep) -> list[dict]:
    return [p.model_dump(mode="json") for p in policies.list_all(state.store)
            if not who.bound or p.tenant == who.tenant]


# -- key policies ------------------------------------------------------------------------------------

@router.put("/key-policies/{endpoint}", response_model=KeyPolicy)
def put_key_policy(endpoint: str, body: KeyPolicyBody, state: StateDep, who: PrincipalDep) -> dict:
    return tenancy_ops.set_key_policy(state, who, endpoint, body).model_dump(mode="json")


@router.get("/key-policies/{endpoint}", response_model=KeyPolicy)
def get_key_policy(endpoint: str, state: StateDep) -> dict:
    policy = key_policies.load(state.store, endpoint)
    if policy is None:
        raise NotFound(f"endpoint {endpoint!r} has no key policy")
    return policy.model_dump(mode="json")


# -- admission ---------------------------------------------------------------------------------------

def _admit(state: AppState, body: dict, who: Principal | None) -> dict:
    if admit.is_review(body):
        uid, _, deployment = admit.review_request(body)
        if deployment is None:
            return admit.review_response(uid, admit.Verdict(True, ()))
        deployment["tenant"] = claimed_tenant(who, deployment.get("tenant"))
        return admit.review_response(uid, admit.review(state.store, deployment, who))
    body = {**body, "tenant": claimed_tenant(who, body.get("tenant"))}
    verdict = admit.review(state.store, body, who)
    return {"allowed": verdict.allowed, "reasons": list(verdict.reasons), "name": verdict.name}


@router.post("/admit", response_model=AdmitVerdict | AdmissionReviewAnswer, response_model_exclude_unset=True)
def admit_with_token(state: StateDep, who: PrincipalDep, body: dict = Body(...)) -> dict:
    return _admit(state, body, who)


def _admit_token(state: AppState) -> str:
    return state.settings.admit_token  # FABRIC_ADMIT_TOKEN, read at start


@webhook.post("/admit/{token}", response_model=AdmitVerdict | AdmissionReviewAnswer,
              response_model_exclude_unset=True)
def admit_webhook(token: str, request: Request, state: StateDep, body: dict = Body(...)) -> dict:
    expected = _admit_token(state)
    # Constant time, and the same 404 whether no token is configured or this one is wrong.
    if not hmac.compare_digest(token.encode(), (expected or os.urandom(16).hex()).encode()) or not expected:
        raise NotFound("not found")
    return _admit(state, body, None)
