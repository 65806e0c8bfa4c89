"""Tenant deploy policies: the hour window (wrapping past midnight), the model and source
allow-lists as a pure planner, and their enforcement on create and scale over real HTTP."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from controlplane.tenancy.policies import Deploy, TenantPolicy, hour_allowed, refusals
from tests.controlplane.tenancy.conftest import MODEL, PROFILE


@pytest.mark.parametrize("start,end,hour,allowed", [
    (None, None, 0, True), (None, None, 23, True),       # both absent: always
    (9, 17, 8, False), (9, 17, 9, True), (9, 17, 16, True), (9, 17, 17, False),  # end excluded
    (22, 6, 21, False), (22, 6, 22, True), (22, 6, 23, True), (22, 6, 0, True),  # wraps midnight
    (22, 6, 5, True), (22, 6, 6, False), (22, 6, 12, False),
    (23, 0, 23, True), (23, 0, 0, False), (0, 23, 23, False), (0, 23, 0, True),
])
def test_hour_window(start, end, hour, allowed):
    assert hour_allowed(start, end, hour) is allowed


@pytest.mark.parametrize("fields,why", [
    ({"deploy_hour_start": 3}, "give both, or neither"),
    ({"deploy_hour_start": 5, "deploy_hour_end": 5}, "empty window"),
    ({"deploy_hour_start": 24, "deploy_hour_end": 5}, "less than or equal to 23"),
])
def test_bad_windows_are_refused(fields, why):
    with pytest.raises(ValidationError, match=why):
        TenantPolicy(tenant="a", **fields)


def test_refusals_name_each_reason_and_no_policy_or_no_tenant_allows():
    policy = TenantPolicy(tenant="a", allowed_models=["m1"], allowed_source_prefixes=["hf://good/"],
                          deploy_hour_start=9, deploy_hour_end=17)
    assert refusals(policy, Deploy("a", "m1", "hf://good/x", 10)) == []
    why = refusals(policy, Deploy("a", "m2", "hf://evil/x", 20))
    assert len(why) == 3 and "allowed_models" in why[0] and "hf://evil/x" in why[1] and "20:xx" in why[2]
    assert refusals(None, Deploy("a", "m2", "hf://evil/x", 20)) == []
    assert refusals(policy, Deploy(None, "m2", "hf://evil/x", 20)) == []


def test_create_and_scale_check_the_tenants_policy(tenancy_fabricd, tokens):
    hour = time.gmtime().tm_hour
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        for body in ({"name": "pol-ok", **MODEL}, {"name": "pol-bad", "source": "hf://Other/Thing"}):
            assert admin.post("/api/ai/models", json=body).status_code == 201
        assert admin.post("/api/ai/profiles", json={"name": "pol-p", **PROFILE}).status_code == 201
        dep = {"profile": "pol-p", "tenant": "pol", "replicas": 1}
        # No policy yet: today's behaviour.
        assert admin.post("/api/ai/deployments", json={"name": "pol-d0", "model": "pol-bad", **dep}).status_code == 201
        policy = {"tenant": "pol", "allowed_models": ["pol-ok", "pol-bad"], "allowed_source_prefixes": ["hf://Qwen/"]}
        assert admin.post("/api/ai/policies", json=policy).status_code == 201
        refused = admin.post("/api/ai/deployments", json={"name": "pol-d1", "model": "pol-bad", **dep})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "policy_refused"
        assert "hf://Other/Thing" in refused.json()["error"]["message"]
        assert admin.post("/api/ai/deployments", json={"name": "pol-d2", "model": "pol-ok", **dep}).status_code == 201
        # Outside the hour window: scale-up refused, scale-down still allowed.
        closed = {"deploy_hour_start": (hour + 1) % 24, "deploy_hour_end": (hour + 2) % 24}
        assert admin.post("/api/ai/policies", json={**policy, **closed}).status_code == 201
        up = admin.post("/api/ai/deployments/pol-d2/scale", json={"replicas": 2})
        assert up.status_code == 403 and "UTC" in up.json()["error"]["message"]
        assert admin.post("/api/ai/deployments/pol-d2/scale", json={"replicas": 0}).status_code == 200
        open_now = {"deploy_hour_start": hour, "deploy_hour_end": (hour + 1) % 24}
        assert admin.post("/api/ai/policies", json={**policy, **open_now}).status_code == 201
        assert admin.post("/api/ai/deployments/pol-d2/scale", json={"replicas": 2}).status_code == 200
        assert "pol" in [p["tenant"] for p in admin.get("/api/ai/policies").json()]
    with tenancy_fabricd.client(tokens["operator-a"]) as a:  # a tenant sees its own policies only
        assert {p["tenant"] for p in a.get("/api/ai/policies").json()} <= {"a"}  # never "pol"
        assert a.post("/api/ai/policies", json=policy).json()["error"]["code"] == "forbidden"
