"""Batch job records: the state machine (pure) and the REST routes over a real SQLite store."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from common import keyspace
from common.errors import Conflict
from common.schemas import InferenceDeployment, Replica
from common.store.connect import open_store
from controlplane.batches.jobs import BatchCreate, cancel, claim, finish, new_job
from tests.support.inprocess_fabricd import serve_fabricd

DIGEST = hashlib.sha256(b"a file of prompts the caller keeps").hexdigest()


def rep(i: int, *, ready=True, draining=False) -> Replica:
    return Replica(replica_id=f"d-{i}", deployment="d", ordinal=i, node="n1", ready=ready, draining=draining,
                   phase="Ready" if ready else "Starting")


def test_claim_needs_a_ready_replica_that_is_not_draining():
    job = new_job(BatchCreate(deployment="d", input_sha256=DIGEST), now=1.0)
    assert job.state == "queued"
    for replicas in ([], [rep(0, ready=False)], [rep(0, draining=True)]):
        with pytest.raises(Conflict, match="no ready replica"):
            claim(job, replicas, 2.0)
    running = claim(job, [rep(0, draining=True), rep(1)], 2.0)
    assert (running.state, running.replica, running.started_at) == ("running", "d-1", 2.0)
    with pytest.raises(Conflict, match="only a queued job"):
        claim(running, [rep(1)], 3.0)


def test_finish_and_cancel_rules():
    job = new_job(BatchCreate(deployment="d", input_sha256=DIGEST), now=1.0)
    with pytest.raises(Conflict, match="only a running job"):
        finish(job, True, 2.0)
    assert cancel(job, 2.0).state == "cancelled"
    running = claim(job, [rep(0)], 2.0)
    assert finish(running, True, 3.0).state == "succeeded"
    failed = finish(running, False, 3.0)
    assert failed.state == "failed" and failed.finished_at == 3.0
    assert cancel(running, 3.0).state == "cancelled"
    for done in (failed, finish(running, True, 3.0), cancel(job, 2.0)):
        with pytest.raises(Conflict, match="already finished"):
            cancel(done, 4.0)


@pytest.fixture
def served_state(tmp_path):
    """(client, store, fabricd's AppState: a test changes a setting through its config)."""
    store = open_store(None, tmp_path)
    store.put(keyspace.deployments("d"), InferenceDeployment(name="d", model="m", profile="p").model_dump_json())
    with serve_fabricd(store, tmp_path) as (client, state):
        yield client, store, state
    store.close()


@pytest.fixture
def served(served_state):
    return served_state[:2]


def put_rep(store, replica: Replica) -> None:
    store.put(keyspace.replicas(replica.deployment, replica.replica_id), replica.model_dump_json())


def test_rest_lifecycle_and_what_is_stored(served):
    api, store = served
    made = api.post("/api/ai/batches", json={"deployment": "d", "input_sha256": DIGEST.upper()})
    assert made.status_code == 201, made.text
    job = made.json()
    assert job["state"] == "queued" and job["input_sha256"] == DIGEST
    bid = job["id"]
    no_replica = api.post(f"/api/ai/batches/{bid}/claim")
    assert no_replica.status_code == 409 and no_replica.json()["error"]["code"] == "no_ready_replica"
    put_rep(store, rep(0, draining=True))
    assert api.post(f"/api/ai/batches/{bid}/claim").status_code == 409
    put_rep(store, rep(1))
    claimed = api.post(f"/api/ai/batches/{bid}/claim").json()
    assert claimed["state"] == "running" and claimed["replica"] == "d-1"
    assert api.get(f"/api/ai/batches/{bid}").json()["state"] == "running"
    assert api.post(f"/api/ai/batches/{bid}/finish", json={"ok": False}).json()["state"] == "failed"
    refused = api.post(f"/api/ai/batches/{bid}/cancel")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "finished"
    stored = store.get(keyspace.batches(bid)).value
    assert set(json.loads(stored)) >= {"id", "deployment", "input_sha256", "state"}
    assert "prompt" not in stored
    second = api.post("/api/ai/batches", json={"deployment": "d", "input_sha256": DIGEST}).json()
    assert api.post(f"/api/ai/batches/{second['id']}/cancel").json()["state"] == "cancelled"
    assert [j["id"] for j in api.get("/api/ai/batches", params={"state": "failed"}).json()] == [bid]
    assert len(api.get("/api/ai/batches", params={"deployment": "d"}).json()) == 2
    assert api.get("/api/ai/batches", params={"state": "done"}).status_code == 422
    assert api.delete(f"/api/ai/batches/{bid}").status_code == 200
    assert api.get(f"/api/ai/batches/{bid}").status_code == 404


@pytest.mark.parametrize("body,field", [
    ({"deployment": "d", "input_sha256": "abc"}, "input_sha256"),
    ({"deployment": "d", "input_sha256": "g" * 64}, "input_sha256"),
    ({"deployment": "d", "input_sha256": DIGEST, "prompt": "never stored"}, "prompt"),
    ({"deployment": "Bad Name", "input_sha256": DIGEST}, "deployment"),
])
def test_bad_bodies_are_422_naming_the_field(served, body, field):
    api, store = served
    resp = api.post("/api/ai/batches", json=body)
    assert resp.status_code == 422 and field in resp.text
    assert "never stored" not in resp.text
    assert store.list(keyspace.batches()) == []


def test_unknown_deployment_and_job(served):
    api, _ = served
    missing = api.post("/api/ai/batches", json={"deployment": "nope", "input_sha256": DIGEST})
    assert missing.status_code == 422 and "nope" in missing.json()["error"]["message"]
    assert api.post("/api/ai/batches/batch-0/claim").status_code == 404
    assert api.post("/api/ai/batches/batch-0/finish", json={"ok": "maybe"}).status_code == 422


def test_two_claims_race_and_one_wins(served):
    api, store = served
    put_rep(store, rep(0))
    bid = api.post("/api/ai/batches", json={"deployment": "d", "input_sha256": DIGEST}).json()["id"]
    with ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(lambda _: api.post(f"/api/ai/batches/{bid}/claim").status_code, range(8)))
    assert codes == [200] + [409] * 7


def test_records_are_capped(served_state):
    api, _, state = served_state
    state.settings = replace(state.settings, max_batches=2)  # as FABRIC_MAX_BATCHES=2 at start
    for _ in range(2):
        assert api.post("/api/ai/batches", json={"deployment": "d", "input_sha256": DIGEST}).status_code == 201
    over = api.post("/api/ai/batches", json={"deployment": "d", "input_sha256": DIGEST})
    assert over.status_code == 429 and "FABRIC_MAX_BATCHES" in over.json()["error"]["message"]
