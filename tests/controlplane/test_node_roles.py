"""The balancer role of a node (issue 49 item 1): taken at registration from the node's grant (its
join token or the admin's certificate issue), or, when the grant is silent, given while no node is a
balancer yet (a single host, a fleet's first node); never changed by the node's own reports; changed
by an admin through PUT /api/ai/nodes/{id}/role and `fabricctl ai node role`. Through fabricd's real
app in-process over SQLite (the registrations call the operation the node route calls)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.agent_api import NodeReport
from common.records import events
from common.records import join_tokens as token_records
from common.records import nodes as node_records
from common.store.connect import open_store
from controlplane import node_certs
from controlplane.ops import nodes as node_ops
from tests.support.inprocess_fabricd import serve_fabricd

BIN = Path(sys.executable).parent


def report(node_id: str) -> NodeReport:
    return NodeReport(id=node_id, address=f"https://10.0.0.{len(node_id)}:7443")


@pytest.fixture
def served(tmp_path):
    store = open_store(None, tmp_path)
    with serve_fabricd(store, tmp_path) as (client, state):
        yield client, state
    store.close()


def test_first_role_follows_the_grant_else_whether_the_fleet_has_a_balancer():
    assert node_ops.first_role(None, fleet_has_balancer=False) is True  # a single host, a fleet's first node
    assert node_ops.first_role(None, fleet_has_balancer=True) is False
    assert node_ops.first_role(True, fleet_has_balancer=True) is True
    assert node_ops.first_role(False, fleet_has_balancer=False) is False


def test_registration_takes_the_role_and_heartbeats_keep_it(served):
    _, state = served
    first, _ = node_ops.register(state, report("gpu-1"))
    second, _ = node_ops.register(state, report("gpu-2"))
    assert first.balancer and not second.balancer
    node_certs.grant(state.store, "lb-1", site="", replica_networks=[], any_node=False, now=time.time(),
                     balancer=True)  # `fabricctl ai node add lb-1 --balancer`
    assert node_ops.register(state, report("lb-1"))[0].balancer
    node_ops.set_role(state, None, "gpu-1", False)
    node_ops.heartbeat(state, report("gpu-1"))  # the node's own report never changes its role
    assert node_records.require(state.store, "gpu-1").balancer is False
    said = {e.name: (e.action, e.message) for e in events.recent_events(state.store, kind="node")}
    assert said["lb-1"][0] == "registered" and said["lb-1"][1].endswith(", a balancer")
    assert said["gpu-1"] == ("role-set", "node gpu-1 is no longer a balancer (by an admin); the routing "
                                         "controller moves its VIP services on its next pass")


def test_the_role_api_changes_it_and_refuses_bad_input(served):
    api, state = served
    node_ops.register(state, report("gpu-1"))
    node_ops.register(state, report("gpu-2"))
    made = api.put("/api/ai/nodes/gpu-2/role", json={"balancer": True})
    assert made.status_code == 200, made.text
    assert made.json()["balancer"] is True and api.get("/api/ai/nodes/gpu-2").json()["balancer"] is True
    assert node_records.require(state.store, "gpu-2").balancer
    assert api.put("/api/ai/nodes/gpu-2/role", json={"balancer": "maybe"}).status_code == 422
    assert api.put("/api/ai/nodes/gpu-2/role", json={"balancer": True, "site": "x"}).status_code == 422
    assert api.put("/api/ai/nodes/gpu-2/role", json={}).status_code == 422
    missing = api.put("/api/ai/nodes/nope/role", json={"balancer": True})
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]
    token = api.post("/api/ai/join-tokens", json={"node_id": "gpu-9", "balancer": False})
    assert token.status_code == 201, token.text
    assert token_records.list(state.store)[0].balancer is False  # the join grants it (node_certs.grant)


def test_fabricctl_node_role_and_the_list_column(served):
    api, state = served
    node_ops.register(state, report("gpu-1"))
    node_ops.register(state, report("gpu-2"))
    env = {"PATH": "/usr/bin:/bin", "FABRIC_URL": str(api.base_url).rstrip("/"),
           "FABRIC_TOKEN": api.headers["Authorization"].split()[1]}

    def fabricctl(*args: str) -> str:
        out = subprocess.run([str(BIN / "fabricctl"), "ai", "node", *args], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    assert "gpu-2 is a balancer" in fabricctl("role", "gpu-2", "--balancer")
    assert "gpu-1 is not a balancer" in fabricctl("role", "gpu-1", "--no-balancer")
    rows = {line.split()[0]: line.split() for line in fabricctl("list").splitlines()[1:]}
    assert "balancer" in rows["gpu-2"] and "balancer" not in rows["gpu-1"]
    assert not node_records.require(state.store, "gpu-1").balancer


def test_a_node_stored_before_roles_existed_stays_a_balancer(tmp_path):
    """An upgraded fleet keeps serving its VIPs: a node record without the field (written before
    nodes had roles, when every node carried the services) reads as a balancer, and a heartbeat
    keeps it one."""
    import json

    from common.keyspace import nodes as node_key
    from common.schemas import Node
    store = open_store(None, tmp_path)
    try:
        old = Node(id="old-1", address="https://10.0.0.9:7443").model_dump(mode="json")
        del old["balancer"]
        store.put(node_key("old-1"), json.dumps(old))
        assert node_records.get(store, "old-1").balancer is True
    finally:
        store.close()
