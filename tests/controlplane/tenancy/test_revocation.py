"""Tokens can be taken back before they expire (issue 40): a deleted user's token is refused at
once, and a logged-out token no longer works (the console's sign-out: tests/controlplane/console/
test_console_logout_revokes.py)."""

from __future__ import annotations

PASSWORD = "revocation-test-pass-42"


def _login(server, name: str) -> str:
    with server.client() as c:
        r = c.post("/api/auth/login", json={"username": name, "password": PASSWORD})
        assert r.status_code == 200, r.text
        return r.json()["token"]


def test_a_deleted_users_token_is_refused(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        assert admin.post("/api/ai/users", json={"name": "rev-ops", "role": "operator",
                                                 "password": PASSWORD}).status_code == 201
    token = _login(tenancy_fabricd, "rev-ops")
    with tenancy_fabricd.client(token) as user:
        assert user.post("/api/ai/models", json={"name": "rev-m1", "source": "hf://Qwen/Qwen3-8B"}).status_code == 201
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        assert admin.delete("/api/ai/users/rev-ops").status_code == 200
        # Re-created under the same name: the old token stays dead, a new login works.
        assert admin.post("/api/ai/users", json={"name": "rev-ops", "role": "operator",
                                                 "password": PASSWORD}).status_code == 201
    with tenancy_fabricd.client(token) as user:
        r = user.post("/api/ai/models", json={"name": "rev-m2", "source": "hf://Qwen/Qwen3-8B"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "token_revoked"
    with tenancy_fabricd.client(_login(tenancy_fabricd, "rev-ops")) as fresh:
        assert fresh.get("/api/auth/whoami").status_code == 200


def test_logout_revokes_the_presented_token_only(tenancy_fabricd):
    with tenancy_fabricd.client() as c:
        first = c.post("/api/auth/login", json={"username": "admin", "password": tenancy_fabricd.password}).json()
        second = c.post("/api/auth/login", json={"username": "admin", "password": tenancy_fabricd.password}).json()
    with tenancy_fabricd.client(first["token"]) as a:
        assert a.post("/api/auth/logout").status_code == 200
        r = a.get("/api/auth/whoami")
        assert r.status_code == 401 and r.json()["error"]["code"] == "token_revoked"
    with tenancy_fabricd.client(second["token"]) as b:
        assert b.get("/api/auth/whoami").status_code == 200

