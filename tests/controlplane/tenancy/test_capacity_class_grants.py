"""Issue 50, medium 6: capacity classes no longer fail open. Each test performs the attack:

- a tenant operator without a grant deploys `critical` (refused; an admin, or a policy naming
  critical, may);
- a tenant whose policy record is unreadable deploys anything (refused: fail closed);
- a tenant's critical replica preempts another tenant's (refused unless an admin set the
  preemptor's policy's preempt_other_tenants);
- explain names another tenant's victims to a tenant-bound caller (counts only).
"""

from __future__ import annotations

import pytest

from common import keyspace
from common.errors import Forbidden
from common.store.sqlite_store import SqliteStore
from controlplane.tenancy import policies
from controlplane.tenancy.policies import Deploy, TenantPolicy, refusals
from tests.controlplane.placement.test_preemption import dep, node, pci, plan, rep, victims
from tests.controlplane.tenancy.conftest import MODEL, PROFILE

PASSWORD = "correct-horse-battery-9"


def test_critical_needs_an_admin_or_a_policy_naming_it():
    crit = Deploy("acme", "m", "hf://o/m", 12, "critical")
    assert "needs an admin" in refusals(None, crit)[0]  # no policy: the default used to allow it
    assert "needs an admin" in refusals(TenantPolicy(tenant="acme"), crit)[0]  # a policy without a class list
    assert refusals(None, crit, admin=True) == []
    assert refusals(TenantPolicy(tenant="acme", allowed_capacity_classes=["critical", "standard"]), crit) == []
    assert "needs an admin" in refusals(None, Deploy(None, "m", None, 12, "critical"))[0]  # no tenant either
    assert refusals(None, Deploy("acme", "m", None, 12, "standard")) == []


def test_an_unreadable_policy_refuses_instead_of_counting_as_none(tmp_path):
    store = SqliteStore(tmp_path / "s.db")
    try:
        store.put(keyspace.policies("acme"), '{"tenant": "acme", "allowed_models": "not-a-list"')
        with pytest.raises(Forbidden) as exc:
            policies.enforce(store, "acme", "m", "standard", admin=False)
        assert exc.value.code == "policy_unreadable"
        policies.enforce(store, "bolt", "m", "standard", admin=False)  # another tenant is not touched
    finally:
        store.close()


def test_a_tenants_replica_preempts_only_its_own_tenant_unless_an_admin_allowed():
    deployments = [dep("crit-a", "critical", tenant="acme"), dep("opp-b", "opportunistic", tenant="bolt"),
                   dep("opp-a", "opportunistic", tenant="acme")]
    nodes = [node("a", 1)]
    theirs = [rep("b-1", "opp-b", "a", [pci(0)])]
    p = plan(nodes, deployments, theirs, "crit-a")
    assert (p.outcome, victims(p)) == ("nothing", [])  # bolt's replica is not acme's to take
    assert victims(plan(nodes, deployments, [rep("a-1", "opp-a", "a", [pci(0)])], "crit-a")) == ["a-1"]
    assert victims(plan(nodes, deployments, theirs, "crit-a", cross_tenant={"acme"})) == ["b-1"]
    # a tenantless deployment (an admin's or a cluster-wide operator's) may take any tenant's
    assert victims(plan(nodes, [*deployments, dep("crit", "critical")], theirs, "crit")) == ["b-1"]


def test_explain_shows_another_tenants_victims_as_a_count():
    deployments = [dep("crit-a", "critical", tenant="acme", profile="p2"), dep("opp-b", "opportunistic", tenant="bolt"),
                   dep("opp-a", "opportunistic", tenant="acme")]
    replicas = [rep("b-1", "opp-b", "a", [pci(0)]), rep("a-1", "opp-a", "a", [pci(1)])]
    p = plan([node("a", 2)], deployments, replicas, "crit-a", cross_tenant={"acme"})
    assert sorted(victims(p)) == ["a-1", "b-1"]
    seen = p.as_dict(viewer="acme")
    assert [v["replica_id"] for v in seen["victims"]] == ["a-1"] and seen["other_tenants_victims"] == 1
    assert "b-1" not in str(seen) and "opp-b" not in str(seen)
    assert len(p.as_dict()["victims"]) == 2  # an admin or a cluster-wide caller sees them all


def test_a_tenant_operator_cannot_deploy_critical_over_the_api(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        assert admin.post("/api/ai/users", json={"name": "ops-crit", "role": "operator", "tenant": "crit-t",
                                                 "password": PASSWORD}).status_code == 201
        assert admin.post("/api/ai/models", json={"name": "crit-m", **MODEL}).status_code == 201
        assert admin.post("/api/ai/profiles", json={"name": "crit-p", **PROFILE}).status_code == 201
    with tenancy_fabricd.client() as c:
        token = c.post("/api/auth/login", json={"username": "ops-crit", "password": PASSWORD}).json()["token"]
    body = {"name": "mine", "model": "crit-m", "profile": "crit-p", "replicas": 0, "capacity_class": "critical"}
    with tenancy_fabricd.client(token) as ops:
        r = ops.post("/api/ai/deployments", json=body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "policy_refused", r.text
        assert ops.post("/api/ai/deployments", json={**body, "capacity_class": "standard"}).status_code == 201
        r = ops.post("/api/ai/apply", json={"documents": [{
            "apiVersion": "fabric/v1", "kind": "InferenceDeployment", "metadata": {"name": "mine"},
            "spec": {"model": "crit-m", "profile": "crit-p", "replicas": 0, "capacity_class": "critical"}}]})
        assert r.status_code == 403, r.text
    with tenancy_fabricd.client(tokens["admin"]) as admin:  # the admin grants it: then the operator may
        assert admin.post("/api/ai/policies", json={"tenant": "crit-t", "allowed_capacity_classes": [
            "critical", "standard"]}).status_code == 201
    with tenancy_fabricd.client(token) as ops:
        assert ops.post("/api/ai/deployments", json={**body, "name": "mine-2"}).status_code == 201


def test_capacity_fit_counts_only_what_the_tenants_preemption_could_take():
    from controlplane.placement.capacity import removable
    from controlplane.placement.preemption import Holder, Holders

    theirs = Holder("b-1", "opp-b", "opportunistic", "a", (pci(0),), 1, 1.0, 0.0, tenant="bolt")
    rank = 2  # critical
    assert removable(Holders.build([theirs], {}), rank, "acme") == {"a": []}
    assert [h.replica_id for h in removable(Holders.build([theirs], {}, cross_tenant={"acme"}), rank, "acme")["a"]] \
        == ["b-1"]
    assert [h.replica_id for h in removable(Holders.build([theirs], {}), rank, None)["a"]] == ["b-1"]
