"""A model deleted and made again from another source starts from nothing: real fabricd, a real
agent (dry-run VMs) and the loopback HF mirror. The old model's failed job must not come back
as the new one's status, and the new model's deployment must not wait on it (issue 41)."""

from __future__ import annotations

import pytest

from lab.rigs.polling import wait_for
from lab.tiny_model import write_tiny_model
from tests.integration.orchestration_harness import start_cluster

# full (scripts/test-full; 12 s); make test covers it with the model jobs' records (tests/controlplane/models/) and the supply chain end to end (tests/integration/test_model_supply.py)
pytestmark = [pytest.mark.e2e, pytest.mark.full]


def status(api, name: str) -> dict:
    r = api.get(f"/api/ai/models/{name}/status")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_remade_model_does_not_inherit_the_deleted_ones_failed_job(tmp_path):
    with start_cluster(tmp_path) as cluster:
        write_tiny_model(cluster.mirror.cfg.root / "fab" / "good", seed=4)
        with cluster.api() as api:
            assert api.post("/api/ai/models", json={"name": "chat", "source": "hf://fab/absent"}).status_code == 201
            assert api.post("/api/ai/models/chat/materialize", json={}).status_code == 202
            failed = wait_for(lambda: (s := status(api, "chat"))["state"] in ("Ready", "Failed") and s, 60,
                              "the first model's job to fail")
            assert failed["state"] == "Failed" and "fab/absent" in str(failed), failed
            assert api.delete("/api/ai/models/chat").status_code == 200
            assert api.post("/api/ai/models", json={"name": "chat", "source": "hf://fab/good"}).status_code == 201
            assert "fab/absent" not in str(status(api, "chat"))
            assert api.post("/api/ai/profiles", json={"name": "g1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1,
                                                      "memory_gib": 1}).status_code == 201
            r = api.post("/api/ai/deployments", json={"name": "chat", "model": "chat", "profile": "g1", "replicas": 1})
            assert r.status_code == 201, r.text
            # No `materialize` by hand: the deployment's replica records the new job and waits for it.
            wait_for(lambda: api.get("/api/ai/deployments/chat").json()["status"]["ready_replicas"] == 1, 90,
                     "the remade model's replica to be ready")
            now = status(api, "chat")
            assert now["state"] == "Ready" and "fab/absent" not in str(now), now
