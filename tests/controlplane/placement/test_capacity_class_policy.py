"""capacity_class on deployments: the default, bad values, and the tenant policy's cap."""

import pytest
from pydantic import ValidationError

from common.schemas import InferenceDeployment
from controlplane.tenancy.policies import Deploy, TenantPolicy, refusals


def test_default_is_standard_and_unknown_classes_are_refused():
    assert InferenceDeployment(name="d", model="m", profile="p").capacity_class == "standard"
    with pytest.raises(ValidationError):
        InferenceDeployment(name="d", model="m", profile="p", capacity_class="urgent")


def test_a_policy_caps_the_classes_a_tenant_may_use():
    policy = TenantPolicy(tenant="acme", allowed_capacity_classes=["standard", "opportunistic"])
    assert refusals(policy, Deploy("acme", "m", "hf://o/m", 12, "opportunistic")) == []
    why = refusals(policy, Deploy("acme", "m", "hf://o/m", 12, "critical"))
    assert why == [("capacity_class 'critical' is not in tenant 'acme''s allowed_capacity_classes "
                    "(standard, opportunistic)")]
    # no class list: critical is an admin's (issue 50), the other classes anyone's
    assert "needs an admin" in refusals(TenantPolicy(tenant="acme", allowed_source_prefixes=None),
                                        Deploy("acme", "m", "hf://o/m", 12, "critical"))[0]
    assert refusals(TenantPolicy(tenant="acme"), Deploy("acme", "m", "hf://o/m", 12, "critical"), admin=True) == []
    with pytest.raises(ValidationError):
        TenantPolicy(tenant="acme", allowed_capacity_classes=["gold"])
