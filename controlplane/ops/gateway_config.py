"""Operations on what the gateway reads for its callers: model aliases, identity mappings for OIDC
callers, and a tenant's inference limits. The gateway applies a change within its cache TTL.

  - An alias names an endpoint that exists (404 naming it) and may not shadow a model a deployment
    serves (409 alias_shadows_model): a name means one thing to every client.
  - An identity mapping's endpoints must exist (422 unknown_endpoint naming them: a typo would
    grant nothing).
Mappings and limits are events when set or deleted.
"""

from __future__ import annotations

import time

from common.errors import Conflict, InvalidInput, NotFound
from common.identity_mappings import IdentityMapping
from common.model_aliases import ModelAlias
from common.records import aliases, deployments, endpoints, identity_mappings, tenant_limits
from common.tenant_limits import TenantLimits
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


def put_alias(ctx: AppState, caller: Principal | None, alias: ModelAlias) -> ModelAlias:
    """Create or replace an alias."""
    if not endpoints.exists(ctx.store, alias.endpoint):
        raise NotFound(f"endpoint {alias.endpoint!r} does not exist")
    served = {str(dep.get("model", "")) for _, dep in deployments.stored_items(ctx.store)} - {""}
    if alias.name in served:
        raise Conflict(f"{alias.name!r} is a model a deployment serves; an alias may not shadow it",
                       code="alias_shadows_model")
    return aliases.put(ctx.store, alias)


def delete_alias(ctx: AppState, caller: Principal | None, name: str) -> None:
    if not aliases.discard(ctx.store, name):
        raise NotFound(f"no alias named {name!r}")


def put_identity_mapping(ctx: AppState, caller: Principal | None, body: IdentityMapping) -> IdentityMapping:
    """Create or replace a mapping."""
    missing = [e for e in body.endpoints if e != "*" and not endpoints.exists(ctx.store, e)]
    if missing:
        raise InvalidInput(f"endpoints: no endpoint named {', '.join(repr(e) for e in missing)}",
                           code="unknown_endpoint")
    mapping = identity_mappings.put(ctx.store, body)
    common.event(ctx, "identity-mapping", mapping.name, "updated",
                 f"identity mapping {mapping.name}: {mapping.claim} holds {mapping.value!r} -> endpoints "
                 f"{', '.join(mapping.endpoints) or '-'}, tenant {mapping.tenant or '-'}")
    return mapping


def delete_identity_mapping(ctx: AppState, caller: Principal | None, name: str) -> None:
    identity_mappings.delete(ctx.store, name)
    common.event(ctx, "identity-mapping", name, "deleted", f"identity mapping {name} deleted")


def set_tenant_limits(ctx: AppState, caller: Principal | None, body: TenantLimits) -> TenantLimits:
    """Create or replace a tenant's limits."""
    limits = tenant_limits.put(ctx.store, body.model_copy(update={"updated_at": time.time()}))
    common.event(ctx, "tenant", limits.tenant, "LimitsSet",
                 f"tenant {limits.tenant} max_context_tokens {limits.max_context_tokens or '-'}", tenant=limits.tenant)
    return limits


def delete_tenant_limits(ctx: AppState, caller: Principal | None, tenant: str) -> None:
    """Back to the gateway-wide limits."""
    tenant_limits.delete(ctx.store, tenant)
    common.event(ctx, "tenant", tenant, "LimitsDeleted", f"tenant {tenant} limits removed", tenant=tenant)
