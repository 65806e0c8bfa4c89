"""Tenant isolation over real HTTP, with real local users logging in: a tenant operator cannot
read, change or learn the existence of another tenant's objects (404 exactly like a name that
does not exist), its lists hold only its tenant, its creates get its tenant, a tenant viewer
only reads, and passwords never reach the log, the events or an answer."""

from __future__ import annotations

import pytest

from tests.controlplane.tenancy.conftest import MODEL, PROFILE, seed

PASSWORD = "correct-horse-battery-9"


def _login(server, name: str, password: str = PASSWORD):
    with server.client() as c:
        return c.post("/api/auth/login", json={"username": name, "password": password})


@pytest.fixture(scope="module")
def world(tenancy_fabricd, tokens):
    """Users ops-a (operator, a), ops-b (operator, b), see-a (viewer, a), each logged in; b's objects."""
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        for name, role, tenant in (("ops-a", "operator", "a"), ("ops-b", "operator", "b"), ("see-a", "viewer", "a")):
            resp = admin.post("/api/ai/users", json={"name": name, "role": role, "tenant": tenant, "password": PASSWORD})
            assert resp.status_code == 201, resp.text
            assert "password" not in resp.text and "argon2" not in resp.text
        b = seed(admin, "b", "iso-b")
        key = admin.post("/api/ai/keys", json={"name": "k-b", "endpoint": b["endpoint"]})
        assert key.status_code == 201, key.text
        b["key"] = key.json()["id"]
        assert admin.post("/api/ai/models", json={"name": "shared-m", **MODEL}).status_code == 201
        assert admin.post("/api/ai/profiles", json={"name": "shared-p", **PROFILE}).status_code == 201
        # Tenant a may register hf:// sources of this organisation only (tenancy.model_sources).
        assert admin.post("/api/ai/policies", json={"tenant": "a", "allowed_source_prefixes": ["hf://Qwen/"]}
                          ).status_code == 201
    logins = {name: _login(tenancy_fabricd, name) for name in ("ops-a", "ops-b", "see-a")}
    for resp in logins.values():
        assert resp.status_code == 200, resp.text
    return b, {name: resp.json() for name, resp in logins.items()}


def test_login_gives_a_token_with_the_users_role_and_tenant(tenancy_fabricd, world):
    _, logins = world
    assert (logins["ops-a"]["role"], logins["ops-a"]["tenant"]) == ("operator", "a")
    with tenancy_fabricd.client(logins["see-a"]["token"]) as c:
        assert c.get("/api/auth/whoami").json() == {"subject": "see-a", "role": "viewer", "tenant": "a"}
    bad = _login(tenancy_fabricd, "ops-a", "wrong-password-123")
    nobody = _login(tenancy_fabricd, "no-such-user", PASSWORD)
    assert bad.status_code == nobody.status_code == 401
    assert bad.json() == nobody.json()  # the answer does not say which names exist


def test_another_tenants_objects_read_exactly_as_absent(tenancy_fabricd, world):
    b, logins = world
    with tenancy_fabricd.client(logins["ops-a"]["token"]) as a:
        for path, kind in (("models", "model"), ("profiles", "profile"), ("deployments", "deployment"),
                           ("endpoints", "endpoint")):
            theirs = a.get(f"/api/ai/{path}/{b[kind]}")
            absent = a.get(f"/api/ai/{path}/{b[kind]}-x")
            assert theirs.status_code == absent.status_code == 404
            assert theirs.json()["error"]["code"] == absent.json()["error"]["code"] == "not_found"
            assert a.delete(f"/api/ai/{path}/{b[kind]}").status_code == 404
        assert a.post(f"/api/ai/deployments/{b['deployment']}/scale", json={"replicas": 3}).status_code == 404
        assert a.get(f"/api/ai/deployments/{b['deployment']}/revisions").status_code == 404
        assert a.get(f"/api/ai/explain/routing/{b['endpoint']}").status_code == 404
        for ref in (b["key"], "k-b"):
            assert a.get(f"/api/ai/keys/{ref}").status_code == 404
            assert a.post(f"/api/ai/keys/{ref}/rotate", json={}).status_code == 404
            assert a.delete(f"/api/ai/keys/{ref}").status_code == 404
        # Referring to b's objects reads as a missing reference, the same as a name that is absent.
        ref = a.post("/api/ai/deployments", json={"name": "d-steal", "model": b["model"], "profile": "shared-p"})
        assert ref.status_code == 422 and ref.json()["error"]["code"] == "missing_reference"
        ep = a.post("/api/ai/endpoints", json={"name": "e-steal", "deployment": b["deployment"]})
        assert ep.status_code == 422
        # An external endpoint's URL and key files are the gateway host's reach: cluster admins only.
        ext = a.post("/api/ai/endpoints", json={"name": "e-out", "deployment": "x", "external": {
            "url": "http://127.0.0.1:2379/v3", "model": "m", "keys": [{"file": "/etc/fabric/provider-keys/k"}]}})
        assert ext.status_code == 403 and ext.json()["error"]["code"] == "forbidden"
        key = a.post("/api/ai/keys", json={"name": "k-steal", "endpoint": b["endpoint"]})
        assert key.status_code == 404
    with tenancy_fabricd.client(logins["ops-b"]["token"]) as owner:  # nothing of b's changed
        dep = owner.get(f"/api/ai/deployments/{b['deployment']}")
        assert dep.status_code == 200 and dep.json()["replicas"] == 1
        assert owner.get(f"/api/ai/keys/{b['key']}").status_code == 200


def test_lists_hold_only_the_callers_tenant_and_the_shared_catalog(tenancy_fabricd, world):
    b, logins = world
    with tenancy_fabricd.client(logins["ops-a"]["token"]) as a:
        made = a.post("/api/ai/models", json={"name": "m-own-a", **MODEL})
        assert made.status_code == 201 and made.json()["tenant"] == "a"  # the creator's tenant
        other = a.post("/api/ai/models", json={"name": "m-into-b", "tenant": "b", **MODEL})
        assert other.status_code == 403 and other.json()["error"]["code"] == "tenant_mismatch"
        dep = a.post("/api/ai/deployments", json={"name": "d-own-a", "model": "m-own-a", "profile": "shared-p"})
        assert dep.status_code == 201, dep.text
        revise = a.post("/api/ai/deployments/d-own-a/revisions", json={"model": b["model"]})
        assert revise.status_code == 422 and revise.json()["error"]["code"] == "missing_reference"
        models = {m["name"] for m in a.get("/api/ai/models").json()}
        assert {"m-own-a", "shared-m"} <= models and b["model"] not in models
        assert {d["name"] for d in a.get("/api/ai/deployments").json()} == {"d-own-a"}
        assert a.get("/api/ai/endpoints").json() == [] and a.get("/api/ai/keys").json() == []
        events = a.get("/api/ai/events", params={"limit": 1000}).json()
        assert events and {e["tenant"] for e in events} == {"a"}
        # The shared catalog is readable, not changeable by a tenant.
        assert a.get("/api/ai/models/shared-m").status_code == 200
        shared = a.delete("/api/ai/models/shared-m")
        assert shared.status_code == 403 and shared.json()["error"]["code"] == "shared_object"
        # Cluster-wide routes are closed to a tenant user.
        assert a.get("/api/ai/nodes").json()["error"]["code"] == "cluster_scoped"


def test_a_tenant_viewer_reads_its_tenant_and_changes_nothing(tenancy_fabricd, world):
    _, logins = world
    with tenancy_fabricd.client(logins["see-a"]["token"]) as v:
        assert "m-own-a" in {m["name"] for m in v.get("/api/ai/models").json()}
        refused = v.post("/api/ai/deployments/d-own-a/scale", json={"replicas": 2})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "read_only"
        assert v.post("/api/ai/users", json={}).status_code == 403


def test_passwords_never_reach_the_log_events_or_user_records(tenancy_fabricd, tokens, world):
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        listed = admin.get("/api/ai/users").text
        events = admin.get("/api/ai/events", params={"limit": 1000}).text
        short = admin.post("/api/ai/users", json={"name": "shorty", "role": "viewer", "password": "tiny-pw"})
    assert short.status_code == 422 and "tiny-pw" not in short.text
    log = (tenancy_fabricd.state_dir.parent / "fabricd.log").read_text()
    for text in (listed, events, log):
        assert PASSWORD not in text and "$argon2" not in text
    assert "ops-a" in listed and "user/ops-a" in events
