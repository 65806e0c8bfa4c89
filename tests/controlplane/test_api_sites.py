"""/api/ai/sites and /api/ai/finops through fabricd's app on loopback (real HTTP, a real SQLite
store the test also writes observed state into), and the model's residency copied onto a
deployment."""

from __future__ import annotations

import time

import pytest

from common import usage_ledger
from common.records import usage_docs
from common.records.lifetimes import Lifetime
from common.schemas import InferenceDeployment, InferenceEndpoint, Replica
from common.store import open_store
from controlplane.orchestration_state import delete_replica, put_replica
from tests.support.inprocess_fabricd import serve_fabricd


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sites")
    store = open_store(f"sqlite://{tmp}/fabric.db")
    with serve_fabricd(store, tmp) as (client, _state):
        yield client, store
    store.close()


@pytest.fixture
def api(served):
    return served[0]


def test_site_crud_and_bad_input(api):
    body = {"name": "pune", "residency": "india", "cost_tier": 0.5, "failover_sites": ["mumbai"],
            "peer_url": "http://127.0.0.1:9/", "fail_closed_unix": 1900000000}
    r = api.post("/api/ai/sites", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["peer_url"] == "http://127.0.0.1:9" and r.json()["nodes"] == []
    assert api.post("/api/ai/sites", json={**body, "cost_tier": 2}).status_code == 200  # replaces
    assert api.get("/api/ai/sites/pune").json()["cost_tier"] == 2
    assert [s["name"] for s in api.get("/api/ai/sites").json()] == ["pune"]
    for bad, word in (({"failover_sites": ["pune"]}, "itself"), ({"cost_tier": -1}, "cost_tier"),
                      ({"peer_url": "http://x/../etc"}, "peer_url"), ({"residency": "Not A Label"}, "residency"),
                      ({"name": "../x"}, "name")):
        r = api.post("/api/ai/sites", json={**body, **bad})
        assert r.status_code == 422 and word in r.text, (bad, r.text)
    assert api.delete("/api/ai/sites/pune").json()["deleted"] is True
    r = api.get("/api/ai/sites/pune")
    assert r.status_code == 404 and r.json()["error"]["code"] == "site_not_found"
    assert api.delete("/api/ai/sites/pune").status_code == 404


def test_deployment_takes_the_model_residency(api):
    api.post("/api/ai/models", json={"name": "resident", "source": "hf://org/m", "residency": "india"})
    api.post("/api/ai/profiles", json={"name": "p1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 4,
                                       "memory_gib": 16})
    r = api.post("/api/ai/deployments", json={"name": "resident", "model": "resident", "profile": "p1"})
    assert r.status_code == 201 and r.json()["residency"] == "india"
    rules = api.get("/api/ai/explain/placement/resident").json()["sites"]
    assert rules["residency"] == "india" and rules["model_residency"] == "india" and rules["minimum_sites"] == 0
    r = api.post("/api/ai/deployments", json={"name": "elsewhere", "model": "resident", "profile": "p1",
                                              "residency": "eu", "minimum_sites": 2, "max_replicas_per_site": 1})
    assert r.status_code == 422 and r.json()["error"]["code"] == "residency_conflict"


def test_finops_from_the_lifetimes_and_the_usage_ledger(served, monkeypatch):
    api, store = served
    now = time.time()
    store.put("/fabric/deployments/billed", InferenceDeployment(name="billed", model="m", profile="p",
                                                                tenant="acme").model_dump_json())
    store.put("/fabric/endpoints/billed-ep", InferenceEndpoint(name="billed-ep", deployment="billed").model_dump_json())
    # One replica, 2 GPUs: created 100 s ago, ready 50 s ago, deleted 10 s ago (through the same
    # writes the reconciler makes, so the ledger records them).
    r = Replica(replica_id="billed-0", deployment="billed", ordinal=0, node="n", gpus=["a", "b"],
                created_at=now - 100)
    put_replica(store, r, now - 100)
    put_replica(store, r.model_copy(update={"ready": True, "ready_since": now - 50}), now - 50)
    delete_replica(store, "billed", "billed-0", now - 10)
    usage_docs.put(store, usage_ledger.UsageDoc(span="hour", start=usage_ledger.hour_of(now), source="gw-1", rows=[
        usage_ledger.UsageRow(tenant="acme", endpoint="billed-ep", model="m", calls=3, input_tokens=500,
                              output_tokens=200)]))
    out = api.get("/api/ai/finops", params={"window": 3600}).json()
    row = {d["deployment"]: d for d in out["deployments"]}["billed"]
    assert row["gpu_seconds_reserved"] == pytest.approx(180, abs=0.01)
    assert row["gpu_seconds_ready"] == pytest.approx(80, abs=0.01)
    assert row["tokens"] == 700 and row["tenant"] == "acme"
    assert {t["tenant"]: t for t in out["tenants"]}["acme"]["tokens"] == 700
    # window 60: [end-60, now-10] x 2 GPUs, where end is when fabricd answered (a little after now)
    got = api.get("/api/ai/finops", params={"window": 60}).json()["deployments"][0]["gpu_seconds_reserved"]
    assert 2 * (50 - (time.time() - now)) - 0.01 <= got <= 100
    assert api.get("/api/ai/finops", params={"window": 0}).status_code == 422


def test_finops_ends_a_lifetime_whose_replica_record_vanished(served):
    api, store = served
    ghost = Replica(replica_id="ghost-0", deployment="ghost", ordinal=0, node="n", gpus=["a"],
                    created_at=time.time() - 30)
    put_replica(store, ghost)
    store.delete("/fabric/replicas/ghost/ghost-0")  # gone without delete_replica (a restore, a hand edit)
    api.get("/api/ai/finops")
    life = Lifetime.model_validate_json(store.get("/fabric/replica-lifetimes/ghost-0").value)
    assert life.ended_at is not None  # it stops counting
