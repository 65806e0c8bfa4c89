"""Model operations: register (its sources checked; a dry run checks the same and writes nothing),
delete (refused while in use) and replicate to another site."""

from __future__ import annotations

import time

from common.errors import Conflict
from common.records import model_sites as site_copies
from common.records import models, sites
from common.records import nodes as node_records
from common.records import rollouts as rollout_records
from common.records.model_jobs import delete_jobs
from common.schemas import ModelArtifact, ModelStatus
from controlplane.models import replicate as replicate_plan
from controlplane.models.sources import check_local_source
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy import model_sources
from controlplane.tenancy.principal import Principal, claimed


def create(ctx: AppState, caller: Principal, body: ModelArtifact, *, dry_run: bool = False) -> ModelArtifact:
    body = claimed(body, caller)
    model_dir = ctx.settings.model_dir  # FABRIC_MODEL_DIR, read at start
    check_local_source(body.source, model_dir)
    for adapter in body.adapters:
        check_local_source(adapter.source, model_dir)
    # A tenant-bound caller: its own model root, and only allow-listed hf:// repositories.
    model_sources.check(ctx.store, caller, [body.source, *(a.source for a in body.adapters)], model_dir)
    model = common.fresh(body, ModelStatus(phase="Registered", message="model registered"))
    if dry_run:
        if common.stored_or_none(ctx.store, "model", model.name) is not None:
            raise Conflict(f"model {model.name!r} already exists", code="already_exists")
        return model
    return common.create(ctx, "model", model, f"model {model.name} from {model.source}")


def delete(ctx: AppState, caller: Principal | None, name: str) -> common.Deletion:
    tenant = common.stored(ctx.store, "model", name).get("tenant")
    common.refuse_if_used("model", name, "deployment",
                          common.users_of(common.stored_list(ctx.store, "deployment"), "model", name))
    common.refuse_if_used("model", name, "rollout of", rollout_records.rollout_users(ctx.store, "model", name))
    deleted = common.delete(ctx, "model", name, tenant)
    delete_jobs(ctx.store, name)  # the cached bytes stay until evicted
    return deleted


def replicate(ctx: AppState, caller: Principal | None, name: str, site_name: str) -> site_copies.SiteCopy:
    """Make model ``name``'s bytes present at site ``site_name`` (controlplane.models.replicate
    decides; a push runs here): the site's copy record, Ready or Pending with the reason. Each
    outcome is an event on the model (the reason, never the token)."""
    model = models.require(ctx.store, name)
    site = sites.get(ctx.store, site_name)
    decision = replicate_plan.decide(model, site_name, site, node_records.list(ctx.store), time.time())
    copy = site_copies.SiteCopy(model=name, site=site_name, phase="Pending", message=decision.message,
                                digest=decision.digest)
    if decision.action == "ready":
        copy = copy.model_copy(update={"phase": "Ready", "via": "node"})
    elif decision.action == "push":
        try:
            config = ctx.settings
            digest = replicate_plan.push(model, decision.digest, site.peer_url, config.replicate_token,
                                         config.model_dir)
            copy = copy.model_copy(update={"phase": "Ready", "via": "peer", "digest": digest,
                                           "message": f"copied to {site.peer_url} (digest {digest[:12]})"})
        except replicate_plan.PushFailed as exc:
            copy = copy.model_copy(update={"message": exc.message})
    copy = site_copies.record(ctx.store, copy)
    ready = copy.phase == "Ready"
    common.event(ctx, "model", name, "Replicated" if ready else "ReplicatePending", f"site {site_name}: {copy.message}",
                 tenant=model.tenant, type="Normal" if ready else "Warning")
    return copy
