"""MIG over the REST API: fabricd (in-process, real SQLite) and, for PCI parents with
FABRIC_PCI_MIG=1, a real fabric-agent app on loopback whose `nvidia-smi` is a fake on PATH that
records its arguments (no GPU is lent to this task; nothing here touches a real GPU)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from agent.api import create_app
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.settings import AgentSettings
from agent.state import AgentState
from agent.vm.dryrun_driver import DryRunDriver
from common import keyspace
from common.schemas import Node, Replica
from common.store.connect import open_store
from controlplane.mig.catalog import MigSettings
from lab.rigs.servers import serve_in_thread
from tests.support.inprocess_fabricd import serve_fabricd

FAKE_SMI = """#!/bin/sh
echo "$@" >> "{log}"
case "$*" in
  *-cgi*) echo "Successfully created GPU instance ID  9 on GPU  0 using profile MIG 1g.10gb (ID 19)"
          echo "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  9 using profile MIG 1g.10gb (ID  0)";;
  *-dci*) echo "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  9";;
  *-dgi*) echo "Successfully destroyed GPU instance ID  9 from GPU  0";;
esac
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    bindir, log = tmp_path / "bin", tmp_path / "nvidia-smi.log"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(FAKE_SMI.format(log=log))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    log.write_text("")
    return log


@pytest.fixture
def agent_state(tmp_path):
    """The agent's state; its settings.pci_mig (FABRIC_PCI_MIG, read at start) is off by default."""
    inventory = NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(2, "h100")))
    return AgentState(node_id="gpu-1", vm_driver=DryRunDriver(tmp_path / "dry"), inventory=inventory)


@pytest.fixture
def agent_url(agent_state):
    with serve_in_thread(create_app(agent_state)) as port:
        yield f"http://127.0.0.1:{port}"


def put_node(store, node_id: str, driver: str, address: str = "http://127.0.0.1:1") -> Node:
    inventory = NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(2, "h100"))).read()
    node = Node(id=node_id, address=address, vm_driver=driver, gpus=inventory.gpus, last_heartbeat=1.0)
    store.put(keyspace.nodes(node_id), node.model_dump_json())
    return node


@pytest.fixture
def fabricd_state(tmp_path):
    """(client, store, fabricd's AppState); its config.mig is FABRIC_PCI_MIG as read at start (off)."""
    store = open_store(None, tmp_path)
    with serve_fabricd(store, tmp_path, insecure=True) as (api, state):
        yield api, store, state
    store.close()


@pytest.fixture
def fabricd(fabricd_state):
    return fabricd_state[:2]


def test_a_lab_node_records_slices_and_placement_sees_them(fabricd):
    api, store = fabricd
    node = put_node(store, "lab-1", "lab")
    parent = node.gpus[0].pci
    made = api.post("/api/ai/nodes/lab-1/mig", json={"parent_bdf": parent, "profile": "1g.10gb"})
    assert made.status_code == 201, made.text
    assert made.json()["mode"] == "record" and made.json()["id"] == f"{parent}--1g.10gb--0"
    second = api.post(f"/api/ai/nodes/lab-1/gpus/{parent}/mig", json={"profile": "2g"})
    assert second.status_code == 201 and second.json()["profile"] == "2g.20gb"
    assert [s["id"] for s in api.get("/api/ai/nodes/lab-1/mig").json()] == [made.json()["id"], second.json()["id"]]
    bad = api.post("/api/ai/nodes/lab-1/mig", json={"parent_bdf": parent, "profile": "9g"})
    assert bad.status_code == 422 and "H100 catalog" in bad.json()["error"]["message"]
    full = api.post("/api/ai/nodes/lab-1/mig", json={"parent_bdf": parent, "profile": "7g.80gb"})
    assert full.status_code == 409 and "does not fit" in full.json()["error"]["message"]
    assert api.post("/api/ai/nodes/nope/mig", json={"parent_bdf": parent, "profile": "1g"}).status_code == 404


def test_a_slice_held_by_a_replica_cannot_be_deleted(fabricd):
    api, store = fabricd
    parent = put_node(store, "lab-1", "dry-run").gpus[0].pci
    sid = api.post("/api/ai/nodes/lab-1/mig", json={"parent_bdf": parent, "profile": "1g"}).json()["id"]
    replica = Replica(replica_id="d-0-abc", deployment="d", ordinal=0, node="lab-1", gpus=[sid])
    store.put(keyspace.replicas("d", replica.replica_id), replica.model_dump_json())
    refused = api.delete(f"/api/ai/nodes/lab-1/mig/{sid}")
    assert refused.status_code == 409 and "d-0-abc" in refused.json()["error"]["message"]
    store.delete(keyspace.replicas("d", replica.replica_id))
    assert api.delete(f"/api/ai/nodes/lab-1/mig/{sid}").status_code == 200
    assert api.get("/api/ai/nodes/lab-1/mig").json() == []
    assert api.delete(f"/api/ai/nodes/lab-1/mig/{sid}").status_code == 404


def test_a_pci_parent_needs_the_flag(fabricd_state, fake_smi):
    api, store, state = fabricd_state
    parent = put_node(store, "gpu-1", "libvirt").gpus[0].pci
    refused = api.post("/api/ai/nodes/gpu-1/mig", json={"parent_bdf": parent, "profile": "1g"})
    assert refused.status_code == 400 and "FABRIC_PCI_MIG=1" in refused.json()["error"]["message"]
    state.settings = replace(state.settings, mig=MigSettings(pci_mig=True, record_only=True))
    recorded = api.post("/api/ai/nodes/gpu-1/mig", json={"parent_bdf": parent, "profile": "1g"})
    assert recorded.status_code == 201 and recorded.json()["mode"] == "record"
    assert fake_smi.read_text() == ""  # record-only: the driver was never called


def test_with_the_flag_the_agent_runs_nvidia_smi_and_destroys_on_delete(fabricd_state, agent_url, agent_state,
                                                                         fake_smi):
    api, store, state = fabricd_state
    state.settings = replace(state.settings, mig=MigSettings(pci_mig=True))  # fabricd's FABRIC_PCI_MIG=1
    agent_state.settings = AgentSettings(pci_mig=True)  # the agent's, as its start read it
    parent = put_node(store, "gpu-1", "libvirt", agent_url).gpus[0].pci
    made = api.post("/api/ai/nodes/gpu-1/mig", json={"parent_bdf": parent, "profile": "1g"})
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["mode"], body["gpu_instance_id"], body["compute_instance_id"]) == ("nvidia-smi", 9, 0)
    assert fake_smi.read_text().splitlines() == [f"mig -i {parent} -cgi 1g.10gb -C"]
    assert api.delete(f"/api/ai/nodes/gpu-1/mig/{body['id']}").status_code == 200
    assert fake_smi.read_text().splitlines()[1:] == [f"mig -i {parent} -gi 9 -ci 0 -dci",
                                                     f"mig -i {parent} -gi 9 -dgi"]


def test_the_agent_refuses_without_its_flag_and_reports_driver_errors(agent_url, agent_state, fake_smi, tmp_path):
    import httpx

    off = httpx.post(f"{agent_url}/v1/gpus/0000:3b:00.0/mig", json={"profile": "1g"})
    assert off.status_code == 400 and off.json()["error"]["code"] == "pci_mig_disabled"
    agent_state.settings = AgentSettings(pci_mig=True)
    assert httpx.post(f"{agent_url}/v1/gpus/not-a-bdf/mig", json={"profile": "1g"}).status_code == 422
    assert httpx.post(f"{agent_url}/v1/gpus/0000:3b:00.0/mig", json={"profile": "5g"}).status_code == 422
    failing = Path(fake_smi.parent / "bin" / "nvidia-smi")
    failing.write_text("#!/bin/sh\necho 'Insufficient Resources' >&2\nexit 2\n")
    resp = httpx.post(f"{agent_url}/v1/gpus/0000:3b:00.0/mig", json={"profile": "1g"})
    assert resp.status_code == 400 and "Insufficient Resources" in resp.json()["error"]["message"]
    assert fake_smi.read_text() == ""
