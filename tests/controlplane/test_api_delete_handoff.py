"""Deleting a deployment while controllers run hands it to the reconciler (phase Deleting, 202).

fabricd runs in-process here (uvicorn in a thread, real HTTP on loopback) so the test can say
"controllers are running" without starting real ones.
"""

from __future__ import annotations

import pytest

from common import keyspace
from common.store.connect import open_store
from tests.support.inprocess_fabricd import serve_fabricd


@pytest.fixture
def served(tmp_path):
    store = open_store(None, tmp_path)
    # as if controlplane.controllers.start(state) had run
    with serve_fabricd(store, tmp_path, controllers_running=True) as (client, _state):
        yield client, store
    store.close()


def test_delete_marks_deleting_and_leaves_the_record_for_the_reconciler(served):
    api, store = served
    api.post("/api/ai/models", json={"name": "m", "source": "/srv/models/m"}).raise_for_status()
    api.post("/api/ai/profiles", json={"name": "p", "gpu": {"count": 1, "vram_gib": 8}, "cpu": 1,
                                       "memory_gib": 1}).raise_for_status()
    api.post("/api/ai/deployments", json={"name": "d", "model": "m", "profile": "p"}).raise_for_status()
    resp = api.delete("/api/ai/deployments/d")
    assert resp.status_code == 202 and resp.json()["status"]["phase"] == "Deleting"
    assert store.get(keyspace.deployments("d")) is not None
    assert api.delete("/api/ai/deployments/d").status_code == 202  # idempotent while in progress
    scale = api.post("/api/ai/deployments/d/scale", json={"replicas": 2})
    assert scale.status_code == 409 and "being deleted" in scale.json()["error"]["message"]
    # Until the reconciler removes the record, the deployment still pins its model.
    assert api.delete("/api/ai/models/m").status_code == 409
    store.delete(keyspace.deployments("d"))  # what the reconciler does once replicas are gone
    assert api.delete("/api/ai/models/m").status_code == 200
    actions = [e["action"] for e in api.get("/api/ai/events", params={"name": "d"}).json()]
    assert actions == ["created", "deleting"]
