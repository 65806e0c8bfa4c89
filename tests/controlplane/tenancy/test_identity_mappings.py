"""Identity mappings and tenant limits in fabricd: REST create/replace, read and delete with
validation that names the bad field, and `fabricctl ai identity-mapping|tenant-limits` as the real
console script, against the tenancy tests' fabricd. (The gateway's reading of them:
tests/gateway/test_gateway_oidc_mappings.py.)"""

from __future__ import annotations

import json
import os

import pytest

from tests.controlplane.tenancy.conftest import seed
from tests.controlplane.test_fabricctl_cli import ctl


@pytest.fixture(scope="module")
def admin(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as client:
        yield client


@pytest.fixture(scope="module")
def endpoint(admin) -> str:
    return seed(admin, "idm", "idm")["endpoint"]


def test_mapping_crud(admin, endpoint):
    body = {"name": "ml-team", "claim": "groups", "value": "/ml-team", "endpoints": [endpoint],
            "issuer": "https://sso.example.test/realms/fabric"}
    made = admin.post("/api/ai/identity-mappings", json=body)
    assert made.status_code == 201, made.text
    assert made.json()["endpoints"] == [endpoint] and made.json()["tenant"] is None
    replaced = admin.post("/api/ai/identity-mappings", json={**body, "endpoints": ["*"]})
    assert replaced.status_code == 201 and replaced.json()["endpoints"] == ["*"]
    assert admin.get("/api/ai/identity-mappings/ml-team").json()["endpoints"] == ["*"]
    assert "ml-team" in [m["name"] for m in admin.get("/api/ai/identity-mappings").json()]
    assert admin.delete("/api/ai/identity-mappings/ml-team").json()["deleted"] is True
    assert admin.get("/api/ai/identity-mappings/ml-team").status_code == 404
    assert admin.delete("/api/ai/identity-mappings/ml-team").status_code == 404


@pytest.mark.parametrize("change, field", [
    ({"claim": "groups claim"}, "claim"),
    ({"claim": "a.b.c.d.e.f"}, "claim"),
    ({"value": ""}, "value"),
    ({"value": "two words"}, "value"),
    ({"endpoints": ["Not_A_Label"]}, "endpoints"),
    ({"endpoints": []}, "endpoints"),  # grants nothing: neither endpoints nor tenant
    ({"tenant": "-bad"}, "tenant"),
    ({"name": "UPPER"}, "name"),
    ({"surprise": 1}, "surprise"),
])
def test_mapping_validation_names_the_field(admin, endpoint, change, field):
    body = {"name": "bad", "claim": "roles", "value": "Fabric.User", "endpoints": [endpoint], **change}
    resp = admin.post("/api/ai/identity-mappings", json=body)
    assert resp.status_code == 422, resp.text
    assert field in resp.text


def test_mapping_to_an_unknown_endpoint_is_refused(admin):
    resp = admin.post("/api/ai/identity-mappings", json={"name": "typo", "claim": "roles", "value": "r",
                                                           "endpoints": ["no-such-endpoint"]})
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "unknown_endpoint"
    assert "no-such-endpoint" in resp.json()["error"]["message"]
    tenant_only = admin.post("/api/ai/identity-mappings", json={"name": "tenant-only", "claim": "roles",
                                                                "value": "r", "tenant": "idm"})
    assert tenant_only.status_code == 201  # a tenant alone grants that tenant's endpoints


def test_tenant_limits_crud_and_validation(admin):
    made = admin.post("/api/ai/tenant-limits", json={"tenant": "idm", "max_context_tokens": 4096})
    assert made.status_code == 201 and made.json()["max_context_tokens"] == 4096
    assert {"tenant": "idm", "max_context_tokens": 4096}.items() <= next(
        t for t in admin.get("/api/ai/tenant-limits").json() if t["tenant"] == "idm").items()
    for bad in ({"tenant": "idm", "max_context_tokens": 0}, {"tenant": "idm", "max_context_tokens": "many"},
                {"tenant": "idm", "max_context_tokens": 4096, "rpm": 3}):
        resp = admin.post("/api/ai/tenant-limits", json=bad)
        assert resp.status_code == 422 and ("max_context_tokens" in resp.text or "rpm" in resp.text), resp.text
    assert admin.delete("/api/ai/tenant-limits/idm").status_code == 200
    assert admin.delete("/api/ai/tenant-limits/idm").status_code == 404


def test_a_tenant_bound_operator_sees_only_its_limits_and_writes_none(tenancy_fabricd, tokens, admin):
    admin.post("/api/ai/tenant-limits", json={"tenant": "a", "max_context_tokens": 100})
    admin.post("/api/ai/tenant-limits", json={"tenant": "zz", "max_context_tokens": 200})
    with tenancy_fabricd.client(tokens["operator-a"]) as op:
        assert [t["tenant"] for t in op.get("/api/ai/tenant-limits").json()] == ["a"]
        assert op.post("/api/ai/tenant-limits", json={"tenant": "a", "max_context_tokens": 9}).status_code == 403
        assert op.post("/api/ai/identity-mappings", json={"name": "x", "claim": "roles", "value": "r",
                                                          "tenant": "a"}).status_code == 403


@pytest.fixture(scope="module")
def cli_env(tenancy_fabricd, tmp_path_factory) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    home = tmp_path_factory.mktemp("identity-cli")
    base.update(FABRIC_URL=tenancy_fabricd.url, HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    ctl(base, "ai", "login", "--password-file", str(tenancy_fabricd.state_dir / "admin-password"))
    return base


def test_fabricctl_identity_mapping_and_tenant_limits(cli_env, endpoint):
    out = ctl(cli_env, "ai", "identity-mapping", "add", "entra-ml", "--claim", "groups",
              "--value", "3c5f6a7b-1111-4222-8333-444455556666", "--endpoint", endpoint, "--json")
    assert json.loads(out.stdout)["endpoints"] == [endpoint]
    listed = ctl(cli_env, "ai", "identity-mapping", "list").stdout
    assert "entra-ml" in listed and "3c5f6a7b-1111-4222-8333-444455556666" in listed
    assert json.loads(ctl(cli_env, "ai", "identity-mapping", "show", "entra-ml", "--json").stdout)["claim"] == "groups"
    bad = ctl(cli_env, "ai", "identity-mapping", "add", "bad", "--claim", "groups claim", "--value", "v",
              "--endpoint", endpoint, ok=False)
    assert bad.returncode != 0 and "--claim" in bad.stderr  # the refusal names the flag typed
    assert "deleted" in ctl(cli_env, "ai", "identity-mapping", "delete", "entra-ml").stdout
    ctl(cli_env, "ai", "tenant-limits", "set", "cli-t", "--max-context-tokens", "2048")
    assert "2048" in ctl(cli_env, "ai", "tenant-limits", "list").stdout
    assert "removed" in ctl(cli_env, "ai", "tenant-limits", "delete", "cli-t").stdout
