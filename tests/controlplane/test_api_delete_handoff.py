"""Deleting a deployment while controllers run hands it to the reconciler (phase Deleting, 202).

fabricd runs in-process here (uvicorn in a thread, real HTTP on loopback) so the test can say
"controllers are running" without starting real ones.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from common import keyspace
from common.store.base import open_store
from controlplane.app import create_app
from controlplane.auth import ensure_admin_password
from controlplane.state import AppState, Settings
from tests.support.servers import free_port


@pytest.fixture
def served(tmp_path):
    ensure_admin_password(tmp_path)
    store = open_store(None, tmp_path)
    state = AppState(store=store, state_dir=tmp_path, settings=Settings(run_controllers=False))
    state.controllers_running = True  # as if controlplane.controllers.start(state) had run
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    password = (tmp_path / "admin-password").read_text().strip()
    token = httpx.post(f"http://127.0.0.1:{port}/api/auth/login",
                       json={"username": "admin", "password": password}).json()["token"]
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}) as c:
        yield c, store
    server.should_exit = True
    thread.join(10)
    store.close()


def test_delete_marks_deleting_and_leaves_the_record_for_the_reconciler(served):
    api, store = served
    api.post("/api/ai/models", json={"name": "m", "source": "/models/m"}).raise_for_status()
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
