"""POST /api/ai/admit and /api/ai/admit/{token}: the tenant policy and quota checks of a deploy,
answered for a plain JSON body or a Kubernetes AdmissionReview exactly as the API server sends
one (tests/controlplane/fixtures/admission_review_create.json), over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.controlplane.tenancy.conftest import MODEL, PROFILE

REVIEW = json.loads((Path(__file__).parent.parent / "fixtures" / "admission_review_create.json").read_text())
ADMIT_TOKEN = "admit-secret-path-token-0123456789"  # conftest's FABRIC_ADMIT_TOKEN


@pytest.fixture(scope="module")
def admin(tenancy_fabricd, tokens):
    with tenancy_fabricd.client(tokens["admin"]) as c:
        assert c.post("/api/ai/models", json={"name": "adm-m", **MODEL}).status_code == 201
        assert c.post("/api/ai/profiles", json={"name": "adm-p", **PROFILE}).status_code == 201
        assert c.post("/api/ai/quotas", json={"tenant": "adm", "max_gpus": 2}).status_code in (200, 201)
        yield c


def _review(replicas: int, operation: str = "CREATE") -> dict:
    doc = json.loads(json.dumps(REVIEW))
    doc["request"]["object"]["spec"]["replicas"] = replicas
    doc["request"]["operation"] = operation
    return doc


def test_an_admission_review_round_trip_over_the_token_path(tenancy_fabricd, admin):
    with tenancy_fabricd.client() as webhook:  # the API server has no user token
        ok = webhook.post(f"/api/ai/admit/{ADMIT_TOKEN}", json=_review(2))
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": REVIEW["request"]["uid"], "allowed": True}}
        over = webhook.post(f"/api/ai/admit/{ADMIT_TOKEN}", json=_review(3)).json()["response"]
        assert over["uid"] == REVIEW["request"]["uid"] and over["allowed"] is False
        assert over["status"]["code"] == 403 and "'adm' GPU quota is 2" in over["status"]["message"]
        assert webhook.post(f"/api/ai/admit/{ADMIT_TOKEN}", json=_review(9, "DELETE")).json()["response"]["allowed"]
        for wrong in (ADMIT_TOKEN[:-1] + "x", "x", ADMIT_TOKEN + "0"):
            resp = webhook.post(f"/api/ai/admit/{wrong}", json=_review(2))
            assert resp.status_code == 404 and ADMIT_TOKEN not in resp.text
        assert webhook.post("/api/ai/admit", json=_review(2)).status_code == 401  # no token, no user


def test_the_tenant_policy_refuses_through_admission_and_nothing_is_written(tenancy_fabricd, admin):
    assert admin.post("/api/ai/policies", json={"tenant": "adm", "allowed_models": ["other"]}).status_code == 201
    try:
        refused = admin.post("/api/ai/admit", json=_review(1)).json()["response"]
        assert refused["allowed"] is False and "allowed_models" in refused["status"]["message"]
        plain = admin.post("/api/ai/admit", json={"name": "adm-chat", "model": "adm-m", "profile": "adm-p",
                                                  "replicas": 1, "tenant": "adm"}).json()
        assert plain["allowed"] is False and "allowed_models" in plain["reasons"][0]
    finally:
        admin.post("/api/ai/policies", json={"tenant": "adm"})
    plain = admin.post("/api/ai/admit", json={"name": "adm-chat", "model": "adm-m", "profile": "adm-p",
                                              "replicas": 1, "tenant": "adm"}).json()
    assert plain == {"allowed": True, "reasons": [], "name": "adm-chat"}
    assert admin.get("/api/ai/deployments/adm-chat").status_code == 404  # a check, not a create


def test_bad_reviews_and_foreign_tenants_are_refused(tenancy_fabricd, admin, tokens):
    no_uid = _review(1)
    del no_uid["request"]["uid"]
    bad = admin.post("/api/ai/admit", json=no_uid)
    assert bad.status_code == 422 and "request.uid" in bad.json()["error"]["message"]
    missing = admin.post("/api/ai/admit", json={"name": "x", "model": "nope", "profile": "adm-p"}).json()
    assert missing["allowed"] is False and "model 'nope' does not exist" in missing["reasons"]
    with tenancy_fabricd.client(tokens["operator-a"]) as a:  # review's tenant label is adm, not a
        assert a.post("/api/ai/admit", json=_review(1)).json()["error"]["code"] == "tenant_mismatch"
