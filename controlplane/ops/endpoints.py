"""Endpoint operations: create (expose a deployment) and delete.

  - An endpoint naming a missing deployment (or one a tenant-bound caller may not see) is 422
    missing_reference; an external endpoint's deployment is a name only (never read). A fallback
    must be an external endpoint.
  - Only an admin creates, changes or deletes an endpoint with outbound reach (403 forbidden).
  - A new endpoint is stored with phase "Pending"; the orchestration controller assigns its VIP.
  - Delete: with controllers running here (and not external) the record is marked Deleting, its
    VIP drains the calls in flight, then the routing controller releases it and the record;
    otherwise the record is deleted at once.
"""

from __future__ import annotations

import time

from common.errors import Forbidden, InvalidInput
from common.records import endpoints
from common.schemas import EndpointStatus, InferenceEndpoint
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy.principal import ADMIN, Principal, claimed


def outbound_reach(endpoint: InferenceEndpoint) -> bool:
    """Does this endpoint send callers' prompts out of the cluster, with a provider key read from
    the gateway host (an external provider, or fallbacks to external endpoints)?"""
    return endpoint.external is not None or bool(endpoint.fallbacks)


def refuse_outbound_reach(who: Principal | None, endpoint: InferenceEndpoint) -> None:
    """Only an admin creates, changes or deletes an endpoint with outbound reach: its URL and key
    files choose which of the gateway host's provider keys go where, so an operator could send
    another team's provider key to a URL of its own. Every path that writes endpoints (these
    operations, apply, restore; the console goes through the API) calls this. None: no user."""
    if who is not None and who.role != ADMIN and outbound_reach(endpoint):
        raise Forbidden("only an admin may create, change or delete an endpoint with an external provider "
                        "or fallbacks; ask an admin", code="forbidden")


def create(ctx: AppState, caller: Principal, body: InferenceEndpoint) -> InferenceEndpoint:
    body = claimed(body, caller)
    refuse_outbound_reach(caller, body)
    for dep in ([] if body.external else [body.deployment]) + body.spillover:
        if common.reference_missing(ctx.store, caller, "deployment", dep):
            raise InvalidInput(f"deployment {dep!r} does not exist", code="missing_reference")
    for name in body.fallbacks:
        if common.reference_missing(ctx.store, caller, "endpoint", name) or \
                endpoints.require(ctx.store, name).external is None:
            raise InvalidInput(f"fallbacks: {name!r} is not an external endpoint", code="missing_reference")
    ep = common.fresh(body, EndpointStatus(phase="Pending", message="waiting for a VIP"))
    message = f"endpoint {ep.name} exposes deployment {ep.deployment} (routing {ep.routing})"
    return common.create(ctx, "endpoint", ep, message)


def delete(ctx: AppState, caller: Principal | None, name: str) -> common.Deletion:
    record = common.stored(ctx.store, "endpoint", name)
    refuse_outbound_reach(caller, InferenceEndpoint.model_validate(record))
    tenant = record.get("tenant")
    if not ctx.controllers_running or record.get("external"):
        return common.delete(ctx, "endpoint", name, tenant)
    ep, _ = common.mark_deleting(ctx, "endpoint", name, {
        "phase": "Deleting", "message": "deletion requested; the VIP drains the calls in flight",
        "deleting_since": time.time()})
    return common.Deletion(ep)  # None: the routing controller finished meanwhile
