"""Playground keys (controlplane.api.playground_keys) on a real fabricd: a viewer gets one only
where the endpoint's key policy sets viewer_playground, the key is as narrow as the policy allows,
and a caller revokes only its own playground keys there."""

from __future__ import annotations

from tests.controlplane.tenancy.conftest import seed


def test_a_viewer_tries_an_endpoint_only_where_its_key_policy_allows(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as admin, tenancy_fabricd.client(tokens["viewer"]) as viewer, \
            tenancy_fabricd.client(tokens["operator"]) as operator, \
            tenancy_fabricd.client(tokens["viewer-a"]) as viewer_a:
        names = seed(admin, "b", "pg")
        ep = names["endpoint"]
        where = f"/api/ai/endpoints/{ep}/playground-key"
        refused = viewer.post(where)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "playground_refused"
        assert "viewer_playground" in refused.json()["error"]["message"]
        assert viewer.post("/api/ai/keys", json={"name": "x", "endpoint": ep}).json()["error"]["code"] == "read_only"
        # An operator needs no policy (it could make the same key through /api/ai/keys).
        op_key = operator.post(where)
        assert op_key.status_code == 201, op_key.text
        assert op_key.json()["name"].startswith("console-try-operator-")
        put = admin.put(f"/api/ai/key-policies/{ep}", json={"viewer_playground": True, "max_ttl_secs": 300,
                                                             "required_scopes": ["model"], "max_request_quota": 5})
        assert put.status_code == 200 and put.json()["viewer_playground"] is True
        minted = viewer.post(where)
        assert minted.status_code == 201, minted.text
        key = minted.json()
        assert key["key"] and key["endpoint"] == ep and key["model"] == names["model"] and key["tenant"] == "b"
        assert key["request_quota"] == 5 and 0 < key["expires_at"] - key["created_at"] <= 300
        assert key["name"].startswith("console-try-viewer-")
        # A viewer of tenant a does not see tenant b's endpoint at all.
        assert viewer_a.post(where).status_code == 404
        # Revoking: only the caller's own playground keys, and only through this route.
        assert viewer.delete(f"/api/ai/keys/{key['id']}").json()["error"]["code"] == "read_only"
        assert viewer.delete(f"{where}/{op_key.json()['id']}").status_code == 404
        assert viewer.delete(f"/api/ai/endpoints/{names['endpoint']}x/playground-key/{key['id']}").status_code == 404
        gone = viewer.delete(f"{where}/{key['id']}")
        assert gone.status_code == 200 and gone.json()["deleted"] is True
        assert admin.get(f"/api/ai/keys/{key['id']}").status_code == 404
        assert admin.get(f"/api/ai/keys/{op_key.json()['id']}").status_code == 200
        # Turning it off again refuses the viewer once more.
        admin.put(f"/api/ai/key-policies/{ep}", json={})
        assert viewer.post(where).json()["error"]["code"] == "playground_refused"


def test_a_caller_holds_only_a_few_live_playground_keys(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as admin, tenancy_fabricd.client(tokens["operator"]) as operator:
        ep = seed(admin, "b", "pg-cap")["endpoint"]
        where = f"/api/ai/endpoints/{ep}/playground-key"
        held = [operator.post(where) for _ in range(4)]
        assert [r.status_code for r in held] == [201] * 4
        over = operator.post(where)
        assert over.status_code == 429 and over.json()["error"]["code"] == "playground_keys_held", over.text
        assert operator.delete(f"{where}/{held[0].json()['id']}").status_code == 200
        assert operator.post(where).status_code == 201  # one revoked: room for one more


def test_concurrent_creates_cannot_pass_the_cap_together(tenancy_fabricd, tokens):
    """Issue 50 (Low): the count was read, then the key written, so a burst of creates all passed
    it. Each key now takes a slot with a create-if-absent."""
    from concurrent.futures import ThreadPoolExecutor

    with tenancy_fabricd.client(tokens["admin"]) as admin:
        ep = seed(admin, "b", "pg-race")["endpoint"]

    def one(_):
        with tenancy_fabricd.client(tokens["operator"]) as operator:
            return operator.post(f"/api/ai/endpoints/{ep}/playground-key").status_code

    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(one, range(12)))
    assert codes.count(201) == 4 and codes.count(429) == 8, codes


def test_the_owner_is_a_field_not_read_from_the_name_and_expired_keys_are_purged(tenancy_fabricd, tokens):
    """Two users whose names agree in their first 40 characters got the same key-name prefix, so
    one could revoke the other's playground keys; and expired ones stayed in the store for ever."""
    import time

    password = "correct-horse-battery-9"
    users = ["u" * 40 + "-one", "u" * 40 + "-two"]
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        ep = seed(admin, "b", "pg-own")["endpoint"]
        for name in users:
            assert admin.post("/api/ai/users", json={"name": name, "role": "operator", "tenant": "b",
                                                     "password": password}).status_code == 201
        assert admin.put(f"/api/ai/key-policies/{ep}", json={"max_ttl_secs": 1}).status_code == 200
    where = f"/api/ai/endpoints/{ep}/playground-key"
    with tenancy_fabricd.client() as c:
        one, two = (c.post("/api/auth/login", json={"username": u, "password": password}).json()["token"]
                    for u in users)
    with tenancy_fabricd.client(one) as first, tenancy_fabricd.client(two) as second, \
            tenancy_fabricd.client(tokens["admin"]) as admin:
        key = first.post(where).json()
        assert second.delete(f"{where}/{key['id']}").status_code == 404  # not the other user's to revoke
        assert admin.get(f"/api/ai/keys/{key['id']}").status_code == 200
        time.sleep(1.1)  # the key policy's 1 s TTL passes
        assert first.post(where).status_code == 201
        assert admin.get(f"/api/ai/keys/{key['id']}").status_code == 404  # purged by the next create
