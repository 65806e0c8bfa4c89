"""Backup and restore over the REST API on a real SQLite store (fabricd served in-process so the
test can plant observed state and compare stores directly)."""

from __future__ import annotations

import copy
import json

import pytest

from common import keyspace
from common.schemas import Site
from common.store.connect import open_store
from controlplane.backup.document import FORMAT, build, plan_restore
from tests.support.inprocess_fabricd import serve_fabricd

HMAC = "test-hmac-secret-for-backup-0123456789"


def populate(api) -> str:
    assert api.post("/api/ai/models", json={"name": "qwen", "source": "hf://Qwen/Qwen3-8B"}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": "g1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 2,
                                              "memory_gib": 8, "runtime": "llama.cpp"}).status_code == 201
    assert api.post("/api/ai/deployments", json={"name": "qwen", "model": "qwen", "profile": "g1",
                                                 "replicas": 3}).status_code == 201
    assert api.post("/api/ai/endpoints", json={"name": "qwen-openai", "deployment": "qwen",
                                               "routing": "least_queue"}).status_code == 201
    made = api.post("/api/ai/keys", json={"name": "ci", "endpoint": "qwen-openai"})
    assert made.status_code == 201, made.text
    return made.json()["key"]


@pytest.fixture
def two_stores(tmp_path):
    env = {"FABRIC_KEY_HMAC_SECRET": HMAC}
    stores = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        stores.append(open_store(None, tmp_path / name))
    with (serve_fabricd(stores[0], tmp_path / "a", env=env) as (a, _),
          serve_fabricd(stores[1], tmp_path / "b", env=env) as (b, _)):
        yield (a, stores[0]), (b, stores[1])
    for s in stores:
        s.close()


def test_backup_holds_desired_state_only_and_no_secret(two_stores):
    (a, store_a), _ = two_stores
    plaintext = populate(a)
    store_a.put(keyspace.sites("eu"), Site(name="eu", region="eu-west").model_dump_json())
    # Observed state the controllers would have written: none of it may reach the backup.
    store_a.put(keyspace.vips("10.96.0.1"), "qwen-openai")
    store_a.put(keyspace.replicas("qwen", "qwen-0-abc"), json.dumps({"replica_id": "qwen-0-abc"}))
    rec = json.loads(store_a.get(keyspace.endpoints("qwen-openai")).value)
    rec["status"] = {"phase": "Ready", "vip": "10.96.0.1", "message": "serving"}
    store_a.put(keyspace.endpoints("qwen-openai"), json.dumps(rec))
    doc = a.post("/api/ai/backup").json()
    assert doc["format"] == FORMAT and doc["version"] == 1
    text = json.dumps(doc)
    assert plaintext not in text and plaintext.split("_", 2)[2] not in text and HMAC not in text
    assert "10.96.0.1" not in text and "qwen-0-abc" not in text
    sections = doc["sections"]
    assert set(sections["deployments"]) == {"qwen"} and sections["deployments"]["qwen"]["replicas"] == 3
    assert "status" not in sections["endpoints"]["qwen-openai"]
    assert [k["name"] for k in sections["keys"].values()] == ["ci"]
    assert all(len(k["hash"]) == 64 for k in sections["keys"].values())
    assert list(sections["revisions"]) == ["qwen/00000001"]
    assert sections["sites"]["eu"]["region"] == "eu-west"


def test_restore_is_a_dry_run_then_applies_then_is_idempotent(two_stores):
    (a, _), (b, store_b) = two_stores
    populate(a)
    doc = a.post("/api/ai/backup").json()
    before = {kv.key for kv in store_b.list("/fabric/")}
    dry = b.post("/api/ai/restore", json=doc)
    assert dry.status_code == 200 and dry.json()["dry_run"] is True
    assert dry.json()["summary"]["create"] == sum(len(v) for v in doc["sections"].values())
    assert {kv.key for kv in store_b.list("/fabric/")} == before
    applied = b.post("/api/ai/restore", params={"apply": "true"}, json=doc).json()
    assert applied["dry_run"] is False and len(applied["written"]) == applied["summary"]["create"]
    assert b.get("/api/ai/endpoints/qwen-openai").json()["status"]["phase"] == "Pending"
    assert b.get("/api/ai/profiles/g1").json()["runtime"] == "llama.cpp"
    key = next(iter(doc["sections"]["keys"].values()))
    assert store_b.get(keyspace.api_key_prefixes(key["prefix"])).value == key["id"]
    assert b.post("/api/ai/backup").json()["sections"] == doc["sections"]
    again = b.post("/api/ai/restore", params={"apply": "true"}, json=doc).json()
    assert again["written"] == [] and again["summary"]["unchanged"] == len(applied["written"])


def test_conflicts_are_refused_unless_replace(two_stores):
    (a, _), (b, _) = two_stores
    populate(a)
    doc = a.post("/api/ai/backup").json()
    assert b.post("/api/ai/restore", params={"apply": "true"}, json=doc).status_code == 200
    assert b.post("/api/ai/deployments/qwen/scale", json={"replicas": 1}).status_code == 200
    dry = b.post("/api/ai/restore", json=doc).json()
    assert [(c["section"], c["name"], c["differs"]) for c in dry["changes"] if c["action"] == "conflict"] == [
        ("deployments", "qwen", ["replicas"])]
    refused = b.post("/api/ai/restore", params={"apply": "true"}, json=doc)
    assert refused.status_code == 409 and "deployments/qwen" in refused.json()["error"]["message"]
    assert b.get("/api/ai/deployments/qwen").json()["replicas"] == 1
    replaced = b.post("/api/ai/restore", params={"apply": "true", "replace": "true"}, json=doc).json()
    assert replaced["written"] == ["deployments/qwen"]
    assert b.get("/api/ai/deployments/qwen").json()["replicas"] == 3


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(format="other"), "not a Fabric backup"),
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d["sections"].update(replicas={}), "replicas"),
    (lambda d: d["sections"]["endpoints"]["qwen-openai"].update(deployment="ghost"), "ghost"),
    (lambda d: d["sections"]["profiles"]["g1"].update(runtime="tgi"), "profiles/g1: runtime"),
    (lambda d: d["sections"]["models"].update({"other": d["sections"]["models"]["qwen"]}), "names itself"),
    (lambda d: d["sections"]["models"].update({"../x": {}}), "not a valid record name"),
])
def test_bad_documents_are_422_and_write_nothing(two_stores, mutate, message):
    (a, _), (b, store_b) = two_stores
    populate(a)
    doc = a.post("/api/ai/backup").json()
    bad = copy.deepcopy(doc)
    mutate(bad)
    before = {kv.key for kv in store_b.list("/fabric/")}
    resp = b.post("/api/ai/restore", params={"apply": "true"}, json=bad)
    assert resp.status_code == 422 and message in resp.json()["error"]["message"], resp.text
    assert {kv.key for kv in store_b.list("/fabric/")} == before


def test_a_key_prefix_held_by_another_key_is_a_conflict(two_stores):
    (a, _), (b, store_b) = two_stores
    populate(a)
    doc = a.post("/api/ai/backup").json()
    key = next(iter(doc["sections"]["keys"].values()))
    store_b.put(keyspace.api_key_prefixes(key["prefix"]), "someone-else")
    resp = b.post("/api/ai/restore", params={"apply": "true"}, json=doc)
    assert resp.status_code == 409 and "someone-else" in resp.json()["error"]["message"]
    assert store_b.list(keyspace.models()) == []


def test_plan_is_pure_over_plain_data():
    doc = build({"models": [(keyspace.models("m"), json.dumps({"name": "m", "source": "hf://a/b",
                                                                "status": {"phase": "Registered"}}))]}, now=1.0)
    assert doc["sections"]["models"] == {"m": {"name": "m", "source": "hf://a/b"}}
    plan = plan_restore(doc, {"models": {"m": {"name": "m", "source": "hf://a/c", "created_at": 5}}})
    assert [(c.action, c.differs) for c in plan.changes] == [("conflict", ("source",))]
