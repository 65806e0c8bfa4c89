"""Tenancy operations: users, tenant deploy policies and endpoint key policies.

Deleting a user revokes its tokens at once (controlplane.tenancy.revocation), not at their
expiry. A key policy is only set on an endpoint that exists (404 naming it). Each change records
an event.
"""

from __future__ import annotations

from common.key_policies import KeyPolicy, KeyPolicyBody
from common.records import endpoints
from common.records import key_policies as key_policy_records
from common.records import policies as policy_records
from common.tenant_policies import TenantPolicy
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy import revocation, users
from controlplane.tenancy.principal import Principal


def create_user(ctx: AppState, caller: Principal | None, body: users.UserCreate) -> users.UserRecord:
    record = users.create(ctx.store, body)
    common.event(ctx, "user", record.name, "created", f"user {record.name}: role {record.role}, tenant "
                 f"{record.tenant or '-'}", tenant=record.tenant)
    return record


def delete_user(ctx: AppState, caller: Principal | None, name: str) -> None:
    users.delete(ctx.store, name)
    revocation.revoke_subject(ctx.store, name)  # the user's tokens stop now, not at their expiry
    common.event(ctx, "user", name, "deleted", f"user {name} deleted; its tokens are revoked")


def set_policy(ctx: AppState, caller: Principal | None, body: TenantPolicy) -> TenantPolicy:
    """A tenant's deploy policy, replacing its last."""
    policy = policy_records.put(ctx.store, body)
    common.event(ctx, "policy", policy.tenant, "updated", f"tenant {policy.tenant} deploy policy set",
                 tenant=policy.tenant)
    return policy


def set_key_policy(ctx: AppState, caller: Principal | None, endpoint: str, body: KeyPolicyBody) -> KeyPolicy:
    endpoints.require(ctx.store, endpoint)
    policy = key_policy_records.put(ctx.store, KeyPolicy(endpoint=endpoint, **body.model_dump()))
    common.event(ctx, "endpoint", endpoint, "key-policy", f"endpoint {endpoint} key policy set")
    return policy
