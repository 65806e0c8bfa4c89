"""Profile operations: create (its runtime checked against the deny/allow lists) and delete
(refused while a deployment or a rollout uses it)."""

from __future__ import annotations

import time

from common.errors import InvalidInput
from common.records import rollouts as rollout_records
from common.schemas import InferenceProfile, runtime_refusal
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal, claimed


def create(ctx: AppState, caller: Principal, body: InferenceProfile) -> InferenceProfile:
    config = ctx.settings  # FABRIC_DENY_RUNTIMES / FABRIC_ALLOW_RUNTIMES, read at start
    refusal = runtime_refusal(body.runtime, config.deny_runtimes, config.allow_runtimes)
    if refusal is not None:
        raise InvalidInput(f"body.runtime: {refusal}")
    profile = claimed(body, caller).model_copy(update={"created_at": time.time()})
    gpu = profile.gpu
    message = f"profile {profile.name}: {profile.runtime}, {gpu.count} GPU x {gpu.vram_gib:g} GiB"
    return common.create(ctx, "profile", profile, message)


def delete(ctx: AppState, caller: Principal | None, name: str) -> common.Deletion:
    tenant = common.stored(ctx.store, "profile", name).get("tenant")
    common.refuse_if_used("profile", name, "deployment",
                          common.users_of(common.stored_list(ctx.store, "deployment"), "profile", name))
    common.refuse_if_used("profile", name, "rollout of", rollout_records.rollout_users(ctx.store, "profile", name))
    return common.delete(ctx, "profile", name, tenant)
