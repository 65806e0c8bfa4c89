"""Per-endpoint key policies: the pure check, and its enforcement at key create and rotate."""

from __future__ import annotations

import pytest

from controlplane.tenancy.key_policies import KeyPolicy, KeyShape, refusals
from tests.controlplane.tenancy.conftest import seed

POLICY = KeyPolicy(endpoint="e", max_ttl_secs=3600, required_scopes=["model", "tenant"], max_request_quota=100)


@pytest.mark.parametrize("key,words", [
    (KeyShape(600, "m", "t", 50), []),
    (KeyShape(3600, "m", "t", 100), []),
    (KeyShape(0, "m", "t", 50), ["never expires"]),
    (KeyShape(3601, "m", "t", 50), ["ttl_secs is 3601"]),
    (KeyShape(600, None, "t", 50), ["model:"]),
    (KeyShape(600, "m", None, 50), ["tenant:"]),
    (KeyShape(600, "m", "t", None), ["no request_quota"]),
    (KeyShape(600, "m", "t", 101), ["request_quota 101"]),
    (KeyShape(0, None, None, None), ["never expires", "model:", "tenant:", "no request_quota"]),
])
def test_refusals_table(key, words):
    why = refusals(POLICY, key)
    assert len(why) == len(words) and all(w in r for w, r in zip(words, why))
    assert refusals(None, key) == []


def test_create_and_rotate_follow_the_endpoint_policy(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as admin:
        names = seed(admin, "kp", "kp")
        ep = names["endpoint"]
        old = admin.post("/api/ai/keys", json={"name": "before", "endpoint": ep})  # before any policy
        assert old.status_code == 201
        assert admin.get(f"/api/ai/key-policies/{ep}").status_code == 404
        put = admin.put(f"/api/ai/key-policies/{ep}", json={"max_ttl_secs": 3600, "required_scopes": ["model"],
                                                              "max_request_quota": 1000})
        assert put.status_code == 200 and admin.get(f"/api/ai/key-policies/{ep}").json()["max_ttl_secs"] == 3600
        assert admin.put("/api/ai/key-policies/no-such-ep", json={}).status_code == 404
        bad = admin.post("/api/ai/keys", json={"name": "loose", "endpoint": ep})
        assert bad.status_code == 403 and bad.json()["error"]["code"] == "key_policy"
        assert "never expires" in bad.json()["error"]["message"] and "model:" in bad.json()["error"]["message"]
        good = admin.post("/api/ai/keys", json={"name": "tight", "endpoint": ep, "model": names["model"],
                                                "ttl_secs": 600, "request_quota": 10})
        assert good.status_code == 201, good.text
        assert admin.post(f"/api/ai/keys/{good.json()['id']}/rotate", json={}).status_code == 200
        stale = admin.post(f"/api/ai/keys/{old.json()['id']}/rotate", json={})
        assert stale.status_code == 403 and "create a new key" in stale.json()["error"]["message"]
        assert good.json()["key"] not in stale.text
    with tenancy_fabricd.client(tokens["operator-a"]) as a:  # another tenant's endpoint: absent
        assert a.get(f"/api/ai/key-policies/{ep}").status_code == 404
        assert a.put(f"/api/ai/key-policies/{ep}", json={}).json()["error"]["code"] == "forbidden"
