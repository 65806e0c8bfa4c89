"""Node drain (controlplane/api/node_drain.py): a node closed to new replicas, its replicas drained the
one way every removal goes, the cordon kept across the node's own heartbeats, and uncordon; through
fabricd's real HTTP API (in-process) over a SQLite store the test also reads."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.agent_api import NodeReport
from common.records import nodes as node_records
from common.records import replicas as replica_records
from common.schemas import Replica
from common.store.connect import open_store
from controlplane.ops.nodes import merge_report
from tests.controlplane.planner_data import gpu, node
from tests.support.inprocess_fabricd import serve_fabricd

BIN = Path(sys.executable).parent


@pytest.fixture
def served(tmp_path):
    store = open_store(None, tmp_path)
    with serve_fabricd(store, tmp_path) as (client, _state):
        now = time.time()
        for nid in ("node-a", "node-b"):
            node_records.put(store, node(nid, gpus=[gpu(0), gpu(1)]).model_copy(update={"last_heartbeat": now}))
        client.post("/api/ai/models", json={"name": "m", "source": "/srv/models/m"}).raise_for_status()
        client.post("/api/ai/profiles", json={"name": "p", "gpu": {"count": 1, "vram_gib": 8}, "cpu": 1,
                                              "memory_gib": 1}).raise_for_status()
        client.post("/api/ai/deployments", json={"name": "d", "model": "m", "profile": "p",
                                                 "replicas": 2}).raise_for_status()
        for i, nid in enumerate(("node-a", "node-b")):
            replica_records.put(store, Replica(replica_id=f"d-{i}", deployment="d", ordinal=i, node=nid,
                                               gpus=[gpu(0).pci], host=f"10.0.0.{i + 2}", port=8000, ready=True,
                                               phase="Ready"))
        yield client, store, tmp_path
    store.close()


def test_drain_cordons_the_node_and_drains_only_its_replicas(served):
    api, store, _ = served
    resp = api.post("/api/ai/nodes/node-a/drain", json={"grace_seconds": 12, "reason": "kernel upgrade"})
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["node"] == "node-a" and body["cordoned"] == "kernel upgrade" and body["drained"] == ["d-0"]
    drained, kept = replica_records.get(store, "d", "d-0"), replica_records.get(store, "d", "d-1")
    assert drained.draining and drained.phase == "Draining" and "node node-a drained" in drained.message
    assert drained.drain_deadline == pytest.approx(body["delete_after"]) and not kept.draining
    # The scheduler gives the node nothing new; the replacement's place is the other node.
    explain = api.get("/api/ai/explain/placement/d").json()
    verdicts = {v["node"]: v for v in explain["nodes"]}
    assert verdicts["node-a"]["eligible"] is False and verdicts["node-a"]["reason"] == "cordoned: kernel upgrade"
    assert explain["node"] == "node-b"
    shown = api.get("/api/ai/nodes/node-a").json()
    assert shown["phase"] == "Cordoned" and "cordoned: kernel upgrade" in shown["message"]
    # Again: nothing new to drain, the cordon stays.
    again = api.post("/api/ai/nodes/node-a/drain", json={"reason": "kernel upgrade"}).json()
    assert again["drained"] == [] and again["cordoned"] == "kernel upgrade"
    actions = [e["action"] for e in api.get("/api/ai/events", params={"name": "node-a"}).json()]
    assert actions.count("NodeDrained") == 2


def test_a_heartbeat_keeps_the_cordon_and_uncordon_reopens(served):
    api, store, _ = served
    assert api.post("/api/ai/nodes/node-b/drain", json={"grace_secs": 0}).status_code == 202
    stored = node_records.get(store, "node-b")
    report = NodeReport(id="node-b", address=stored.address, site=stored.site, gpus=stored.gpus)
    assert merge_report(stored, report, time.time()).cordoned == "drained by an admin"
    resp = api.post("/api/ai/nodes/node-b/uncordon")
    assert resp.status_code == 200 and resp.json()["cordoned"] == "" and resp.json()["phase"] == "Ready"
    assert node_records.get(store, "node-b").cordoned == ""
    explain = api.get("/api/ai/explain/placement/d").json()
    assert {v["node"]: v["eligible"] for v in explain["nodes"]}["node-b"] is True


@pytest.mark.parametrize("body,field", [({"grace_secs": -1}, "grace_secs"), ({"grace_secs": "soon"}, "grace_secs"),
                                        ({"reason": ""}, "reason"), ({"reason": "x" * 201}, "reason"),
                                        ({"graceful": True}, "graceful")])
def test_bad_drain_bodies_are_422_naming_the_field(served, body, field):
    api, store, _ = served
    resp = api.post("/api/ai/nodes/node-a/drain", json=body)
    assert resp.status_code == 422 and field in resp.json()["error"]["message"], resp.text
    assert node_records.get(store, "node-a").cordoned == ""  # nothing half-written


def test_unknown_nodes_are_404(served):
    api, _, _ = served
    for path in ("/api/ai/nodes/nope/drain", "/api/ai/nodes/nope/uncordon"):
        resp = api.post(path, json={})
        assert resp.status_code == 404 and "nope" in resp.json()["error"]["message"], (path, resp.text)


def test_fabricctl_node_drain_and_uncordon(served):
    api, _, _ = served
    token = api.headers["Authorization"].removeprefix("Bearer ")
    env = {"PATH": "/usr/bin:/bin", "FABRIC_URL": str(api.base_url).rstrip("/"), "FABRIC_TOKEN": token}
    out = subprocess.run([str(BIN / "fabricctl"), "ai", "node", "drain", "node-a", "--grace-seconds", "5",
                          "--reason", "disk swap"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "node node-a cordoned (disk swap); 1 replicas draining, 5s grace" in out.stdout and "d-0" in out.stdout
    listed = subprocess.run([str(BIN / "fabricctl"), "ai", "node", "list"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert "Cordoned" in listed.stdout, listed.stdout
    back = subprocess.run([str(BIN / "fabricctl"), "ai", "node", "uncordon", "node-a", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert back.returncode == 0 and '"phase": "Ready"' in back.stdout, back.stdout + back.stderr


def test_deployment_drain_takes_grace_seconds_as_the_product_notes_spell_it(served):
    api, store, _ = served
    resp = api.post("/api/ai/deployments/d/drain", json={"grace_seconds": 40, "replica": "d-1"})
    assert resp.status_code == 202, resp.text
    assert replica_records.get(store, "d", "d-1").drain_deadline == pytest.approx(time.time() + 40, abs=5)
    token = api.headers["Authorization"].removeprefix("Bearer ")
    env = {"PATH": "/usr/bin:/bin", "FABRIC_URL": str(api.base_url).rstrip("/"), "FABRIC_TOKEN": token}
    out = subprocess.run([str(BIN / "fabricctl"), "ai", "deployment", "drain", "d", "--grace-seconds", "300",
                          "--replica", "d-0"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert replica_records.get(store, "d", "d-0").drain_deadline == pytest.approx(time.time() + 300, abs=5)
    old = subprocess.run([str(BIN / "fabricctl"), "ai", "deployment", "drain", "d", "--grace-secs", "7"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert old.returncode == 0, old.stderr  # the older spelling is kept
    assert api.get("/api/ai/deployments/d").json()["replicas"] == 0


def test_a_whole_deployment_drain_drains_its_replicas_only(served):
    """Without a replica, every replica of the deployment drains (read from its own replica records),
    and none of a deployment whose name merely starts with its name."""
    api, store, _ = served
    api.post("/api/ai/deployments", json={"name": "d2", "model": "m", "profile": "p", "replicas": 1}).raise_for_status()
    replica_records.put(store, Replica(replica_id="d2-0", deployment="d2", ordinal=0, node="node-a",
                                       gpus=[gpu(1).pci], host="10.0.0.9", port=8000, ready=True, phase="Ready"))
    resp = api.post("/api/ai/deployments/d/drain", json={"grace_seconds": 30})
    assert resp.status_code == 202, resp.text
    assert sorted(resp.json()["drained"]) == ["d-0", "d-1"]
    assert [r.replica_id for r in replica_records.list(store) if r.draining] == ["d-0", "d-1"]
    assert api.post("/api/ai/deployments/d/drain", json={"grace_seconds": 30}).json()["drained"] == []  # harmless again
