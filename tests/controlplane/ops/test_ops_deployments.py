"""The operations layer called directly, with no HTTP in between (what declarative apply and
the routes share): references, quota with its QuotaRefused event, Deleting, outbound reach."""

from __future__ import annotations

import pytest

from common.errors import Conflict, Forbidden, InvalidInput
from common.records import deployments as deployment_records
from common.records.events import recent_events
from common.schemas import (
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    ModelArtifact,
    TenantQuota,
)
from controlplane.api.documents import find_kind
from controlplane.ops import deployments, endpoints, models, profiles, quotas
from controlplane.state import AppState
from controlplane.tenancy.principal import ADMIN, Principal

ADMIN_CALLER = Principal("root", ADMIN)
OPERATOR = Principal("ops", "operator", "acme")


@pytest.fixture
def ctx(store, tmp_path) -> AppState:
    state = AppState(store=store, state_dir=tmp_path)
    models.create(state, ADMIN_CALLER, ModelArtifact(name="m", source="hf://Qwen/Qwen3-8B"))
    profiles.create(state, ADMIN_CALLER, InferenceProfile.model_validate(
        {"name": "p", "runtime": "vllm", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 8, "memory_gib": 32}))
    return state


def test_create_refuses_a_missing_reference_naming_it(ctx):
    with pytest.raises(InvalidInput) as err:
        deployments.create(ctx, ADMIN_CALLER, InferenceDeployment(name="d", model="gone", profile="p"))
    assert err.value.code == "missing_reference"
    assert "model 'gone' does not exist" in err.value.message


def test_scale_over_quota_is_refused_with_an_event_and_scale_down_passes(ctx):
    quotas.set_quota(ctx, ADMIN_CALLER, TenantQuota(tenant="acme", max_gpus=1))
    created = deployments.create(ctx, OPERATOR, InferenceDeployment(name="d", model="m", profile="p"))
    assert created.tenant == "acme" and created.revision == 1
    with pytest.raises(Conflict) as err:
        deployments.scale(ctx, OPERATOR, "d", deployments.ScaleRequest(replicas=2))
    assert err.value.code == "quota_exceeded"
    assert [e.reason for e in recent_events(ctx.store, name="d")].count("QuotaRefused") == 1
    assert deployments.scale(ctx, OPERATOR, "d", deployments.ScaleRequest(replicas=0)).replicas == 0


def test_delete_with_controllers_marks_deleting_and_then_scale_is_refused(ctx):
    ctx.controllers_running = True
    deployments.create(ctx, ADMIN_CALLER, InferenceDeployment(name="d", model="m", profile="p"))
    deletion = deployments.delete(ctx, ADMIN_CALLER, "d")
    assert deletion.pending and deletion.record.status.phase == "Deleting"
    with pytest.raises(Conflict) as err:
        deployments.scale(ctx, ADMIN_CALLER, "d", deployments.ScaleRequest(replicas=3))
    assert err.value.code == "deleting"
    ctx.controllers_running = False


def test_apply_kinds_name_the_operations_and_update_goes_through_scale(ctx):
    kind = find_kind("deployments")
    assert kind.create is deployments.create and kind.update is deployments.update
    kind.create(ctx, ADMIN_CALLER, InferenceDeployment(name="d", model="m", profile="p"))
    kind.update(ctx, ADMIN_CALLER, "d", {"replicas": 2, "capacity_class": "opportunistic"})
    stored = deployment_records.require(ctx.store, "d")
    assert (stored.replicas, stored.capacity_class) == (2, "opportunistic")
    assert "scaled" in [e.reason for e in recent_events(ctx.store, name="d")]


def test_an_operator_may_not_create_an_endpoint_with_outbound_reach(ctx):
    deployments.create(ctx, OPERATOR, InferenceDeployment(name="d", model="m", profile="p"))
    with pytest.raises(Forbidden):
        endpoints.create(ctx, OPERATOR, InferenceEndpoint(name="e", deployment="d", fallbacks=["out"]))
    created = endpoints.create(ctx, OPERATOR, InferenceEndpoint(name="e", deployment="d"))
    assert created.status.phase == "Pending" and created.tenant == "acme"


def test_applys_quota_change_keeps_the_limits_it_does_not_name(ctx):
    quotas.set_quota(ctx, ADMIN_CALLER, TenantQuota(tenant="acme", max_gpus=4, max_cpu=32, guaranteed_gpus=1))
    changed = quotas.update(ctx, ADMIN_CALLER, "acme", {"max_memory_gib": 128})
    assert (changed.max_gpus, changed.max_cpu, changed.max_memory_gib, changed.guaranteed_gpus) == (4, 32, 128, 1)
    events = [e for e in recent_events(ctx.store) if e.reason == "QuotaSet"]
    assert "max_memory_gib 128" in events[-1].message and "max_gpus 4" in events[-1].message
