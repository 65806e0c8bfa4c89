"""A key acts for its endpoint's tenant: a cluster-wide operator cannot give a key on tenant b's
endpoint another tenant (issue 40), which would bill and limit b's calls as someone else's."""

from __future__ import annotations

from tests.controlplane.tenancy.conftest import seed


def test_a_key_cannot_name_another_tenant_than_its_endpoints(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        b = seed(admin, "b", "kt-b")
    with tenancy_fabricd.client(tokens["operator"]) as op:
        other = op.post("/api/ai/keys", json={"name": "k-other", "endpoint": b["endpoint"], "tenant": "a"})
        assert other.status_code == 403 and other.json()["error"]["code"] == "tenant_mismatch"
        same = op.post("/api/ai/keys", json={"name": "k-same", "endpoint": b["endpoint"], "tenant": "b"})
        assert same.status_code == 201 and same.json()["tenant"] == "b"
        plain = op.post("/api/ai/keys", json={"name": "k-plain", "endpoint": b["endpoint"]})
        assert plain.status_code == 201, plain.text
