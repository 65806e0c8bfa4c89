"""Backup from a cluster on SQLite, restore into a cluster on a real etcd, and the controllers
bring the same endpoints back. Both clusters are real fabricd (controllers on) and real
fabric-agent (dry-run driver) processes; the operator steps are the real `fabricctl` commands.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from lab.rigs.etcd_server import ETCD_BINARY, EtcdServer, etcd_available
from lab.rigs.polling import clean_env, wait_for
from tests.integration.orchestration_harness import BIN, deploy, start_cluster

# full: make test keeps backup and restore on SQLite (tests/controlplane/backup/) and the store contract on etcd.
pytestmark = [pytest.mark.full, pytest.mark.e2e, pytest.mark.etcd,
              pytest.mark.skipif(not etcd_available(), reason=f"etcd binary not found at {ETCD_BINARY}")]
HMAC = {"FABRIC_KEY_HMAC_SECRET": "backup-restore-hmac-0123456789abcdef"}
SPEC_FIELDS = ("deployment", "routing", "port", "openai_compatible", "allowed_sites", "preferred_site")


def fabricctl(cluster, *args: str) -> subprocess.CompletedProcess:
    env = clean_env({"FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token})
    return subprocess.run([str(BIN / "fabricctl"), *args], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def serving(api, endpoint: str, deployment: str, replicas: int) -> bool:
    ep = api.get(f"/api/ai/endpoints/{endpoint}").json()
    dep = api.get(f"/api/ai/deployments/{deployment}").json()
    return bool(ep["status"].get("vip")) and dep["status"].get("ready_replicas") == replicas


def test_backup_on_sqlite_restores_into_etcd_and_serves_again(tmp_path):
    backup = tmp_path / "fabric-backup.json"
    with start_cluster(tmp_path / "sqlite", gpus=3, env=HMAC) as old, old.api() as api:
        deploy(api, "chat", "chat-openai", 2, routing="least_queue")
        assert api.post("/api/ai/keys", json={"name": "ci", "endpoint": "chat-openai"}).status_code == 201
        try:
            wait_for(lambda: serving(api, "chat-openai", "chat", 2), 90, "the SQLite cluster to serve")
        except AssertionError:
            raise AssertionError(old.tail()) from None
        before = api.get("/api/ai/endpoints/chat-openai").json()
        done = fabricctl(old, "ai", "backup")
        assert done.returncode == 0, done.stderr
        backup.write_text(done.stdout)
    doc = json.loads(backup.read_text())
    assert set(doc["sections"]["endpoints"]) == {"chat-openai"}

    with EtcdServer() as etcd, \
            start_cluster(tmp_path / "etcd", gpus=3, env={**HMAC, **etcd.env("fabricd")},
                          fabricd_args=("--store", etcd.url)) as new, \
            new.api() as api:
        dry = fabricctl(new, "ai", "restore", str(backup))
        assert dry.returncode == 0, dry.stderr
        assert "dry run" in dry.stdout and "chat-openai" in dry.stdout
        assert api.get("/api/ai/endpoints").json() == []
        applied = fabricctl(new, "ai", "restore", str(backup), "--apply")
        assert applied.returncode == 0, applied.stderr
        assert "wrote" in applied.stdout
        try:
            wait_for(lambda: serving(api, "chat-openai", "chat", 2), 90, "the etcd cluster to serve")
        except AssertionError:
            raise AssertionError(new.tail()) from None
        after = api.get("/api/ai/endpoints/chat-openai").json()
        assert {k: after[k] for k in SPEC_FIELDS} == {k: before[k] for k in SPEC_FIELDS}
        wait_for(lambda: sum(r["included"] for r in api.get("/api/ai/explain/routing/chat-openai").json()[
            "replicas"]) == 2, 30, "both restored replicas to be routed")
        keys = api.get("/api/ai/keys").json()
        assert [k["name"] for k in keys] == ["ci"]
        # It really is etcd that holds the restored state.
        store = etcd.open("fabricd")
        try:
            assert store.get("/fabric/endpoints/chat-openai") is not None
        finally:
            store.close()
        # Restoring again changes nothing; a changed record is a conflict until --replace.
        again = fabricctl(new, "ai", "restore", str(backup), "--apply")
        assert again.returncode == 0 and "wrote 0 record(s)" in again.stdout, again.stdout
        assert api.post("/api/ai/deployments/chat/scale", json={"replicas": 1}).status_code == 200
        refused = fabricctl(new, "ai", "restore", str(backup), "--apply")
        assert refused.returncode == 1 and "deployments/chat" in refused.stderr
        assert fabricctl(new, "ai", "restore", str(backup), "--apply", "--replace").returncode == 0
        assert api.get("/api/ai/deployments/chat").json()["replicas"] == 2
