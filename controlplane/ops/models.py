"""Model operations: register (its sources checked; a dry run checks the same and writes nothing)
and delete (refused while in use)."""

from __future__ import annotations

from common.errors import Conflict
from common.records import rollouts as rollout_records
from common.records.model_jobs import delete_jobs
from common.schemas import ModelArtifact, ModelStatus
from controlplane.models.sources import check_local_source
from controlplane.ops import common
from controlplane.settings import of as settings_of
from controlplane.state import AppState
from controlplane.tenancy import model_sources
from controlplane.tenancy.principal import Principal, claimed


def create(ctx: AppState, caller: Principal, body: ModelArtifact, *, dry_run: bool = False) -> ModelArtifact:
    body = claimed(body, caller)
    model_dir = settings_of(ctx).model_dir  # FABRIC_MODEL_DIR, read at start
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
