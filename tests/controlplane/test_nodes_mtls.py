"""Nodes through real mutual TLS on loopback: fabricd (its real app, SQLite store, uvicorn with
controlplane.node_identity's protocol) and a real agent (dry-run driver, fake NVML GPUs).

Node identity is the client certificate's CN; a missing certificate, a certificate from another
CA, or node A's certificate used as node B cannot register or heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from agent.api import create_app as create_agent_app
from agent.heartbeat import Heartbeat, HostResources
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.state import AgentState
from agent.vm.dryrun_driver import DryRunDriver
from common import keyspace
from common.agent_api import NodeReport, VmCreateRequest
from common.errors import Refused, TransientError
from common.peer_cert import PeerCertH11Protocol
from common.pki import client_ssl_context, ensure_ca, issue_cert
from common.schemas import GpuInfo, Node
from common.store.sqlite_store import SqliteStore
from controlplane.agent_client import AgentClients
from controlplane.api.nodes import node_view
from controlplane.app import create_app
from controlplane.auth import ensure_admin_password
from controlplane.node_identity import uvicorn_tls_kwargs
from controlplane.ops.nodes import merge_report
from controlplane.settings import FabricdSettings
from controlplane.state import AppState
from lab.rigs.servers import free_port, serve_in_thread

BIN = Path(sys.executable).parent


def gpu(pci: str, **kw) -> GpuInfo:
    return GpuInfo(index=0, uuid=f"GPU-{pci}", name="NVIDIA H100", pci=pci, memory_total_mib=81559, **kw)


def report(node_id: str, **kw) -> dict:
    return NodeReport(id=node_id, address="https://127.0.0.1:9443", **kw).model_dump(mode="json")


@pytest.fixture(scope="module")
def fabricd(tmp_path_factory):
    yield from serve_fabricd(tmp_path_factory.mktemp("fabricd"), FabricdSettings())


def serve_fabricd(state_dir: Path, settings: FabricdSettings):
    """fabricd's real app over mutual TLS on loopback; yields what the tests use."""
    ensure_admin_password(state_dir)
    ca, _ = ensure_ca(state_dir)
    crt, key = issue_cert(state_dir, "fabricd", server=True, client=True, role="fabricd")
    store = SqliteStore(state_dir / "fabric.db")
    state = AppState(store=store, state_dir=state_dir, settings=settings)
    with serve_in_thread(create_app(state), **uvicorn_tls_kwargs(crt, key, ca)) as port:
        url = f"https://127.0.0.1:{port}"
        with httpx.Client(base_url=url, verify=client_ssl_context(ca), timeout=10) as c:
            token = c.post("/api/auth/login", json={
                "username": "admin", "password": (state_dir / "admin-password").read_text().strip()}).json()["token"]
        yield {"url": url, "state": state, "ca": ca, "token": token, "dir": state_dir}
    store.close()


@pytest.fixture(scope="module")
def admin(fabricd):
    with httpx.Client(base_url=fabricd["url"], verify=client_ssl_context(fabricd["ca"]), timeout=10,
                      headers={"Authorization": f"Bearer {fabricd['token']}"}) as c:
        yield c


def node_files(admin, tmp: Path, node_id: str, site: str | None = None) -> tuple[Path, Path, Path]:
    """Issue node_id's certificate through the API, as `fabricctl ai node add` does."""
    r = admin.post(f"/api/ai/nodes/{node_id}/certificate", json={"hosts": ["127.0.0.1"], "site": site})
    assert r.status_code == 200, r.text
    issued = r.json()
    d = tmp / node_id
    d.mkdir()
    for name, field in ((f"{node_id}.crt", "cert_pem"), (f"{node_id}.key", "key_pem"), ("ca.crt", "ca_pem")):
        (d / name).write_text(issued[field])
    return d / f"{node_id}.crt", d / f"{node_id}.key", d / "ca.crt"


@contextmanager
def as_node(fabricd, files):
    crt, key, ca = files
    with httpx.Client(base_url=fabricd["url"], verify=client_ssl_context(ca, crt, key), timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def node_a(admin, tmp_path_factory):
    return node_files(admin, tmp_path_factory.mktemp("node-a"), "node-a")


# -- identity ---------------------------------------------------------------------------------------

def test_register_and_heartbeat_with_the_node_certificate(fabricd, admin, node_a):
    with as_node(fabricd, node_a) as c:
        first = c.post("/api/ai/nodes", json=report("node-a", gpus=[gpu("0000:3b:00.0").model_dump()]))
        assert first.status_code in (200, 201), first.text
        beat = c.post("/api/ai/nodes/node-a/heartbeat", json=report("node-a", cpu_free=7))
        assert beat.status_code == 200, beat.text
        assert beat.json()["cpu_free"] == 7 and beat.json()["phase"] == "Ready"
    listed = {n["id"]: n for n in admin.get("/api/ai/nodes").json()}
    assert listed["node-a"]["online"] is True


def test_no_certificate_cannot_register_or_heartbeat(fabricd):
    with httpx.Client(base_url=fabricd["url"], verify=client_ssl_context(fabricd["ca"]), timeout=10) as c:
        r = c.post("/api/ai/nodes", json=report("node-a"))
        assert r.status_code == 401 and r.json()["error"]["code"] == "no_node_certificate"
        assert c.post("/api/ai/nodes/node-a/heartbeat", json=report("node-a")).status_code == 401


def test_an_admin_token_is_not_a_node_identity(fabricd, admin):
    r = admin.post("/api/ai/nodes/node-a/heartbeat", json=report("node-a"))
    assert r.status_code == 401


def test_node_a_cannot_act_as_node_b(fabricd, node_a):
    with as_node(fabricd, node_a) as c:
        assert c.post("/api/ai/nodes", json=report("node-b")).status_code == 403
        r = c.post("/api/ai/nodes/node-b/heartbeat", json=report("node-b"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "wrong_node"
        # Path says node-a (its own), body claims node-b: still refused.
        assert c.post("/api/ai/nodes/node-a/heartbeat", json=report("node-b")).status_code == 422


def test_a_certificate_from_another_ca_fails_the_handshake(fabricd, tmp_path):
    crt, key = issue_cert(tmp_path / "rogue", "node-a", server=False, client=True, role="node")
    ctx = client_ssl_context(fabricd["ca"], crt, key)
    with pytest.raises(httpx.TransportError), httpx.Client(base_url=fabricd["url"], verify=ctx, timeout=5) as c:
        c.post("/api/ai/nodes", json=report("node-a"))


def test_heartbeat_before_registration_is_404_and_the_agent_registers(fabricd, admin, tmp_path):
    files = node_files(admin, tmp_path, "node-c", site="eu-1")  # the site comes from the admin
    with as_node(fabricd, files) as c:
        r = c.post("/api/ai/nodes/node-c/heartbeat", json=report("node-c"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_registered"
        inventory = NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(2, "h200")))
        state = AgentState(node_id="node-c", vm_driver=DryRunDriver(tmp_path / "dry"), inventory=inventory,
                           site="eu-1", failure_domain="rack-7", taints=["maintenance"])
        beat = Heartbeat(state, c, "https://127.0.0.1:9555", resources=lambda: HostResources(12, 100.5))
        beat.registered = True  # as if fabricd lost the record after a registration
        beat.beat()
        assert beat.registered
    node = admin.get("/api/ai/nodes/node-c").json()
    assert node["site"] == "eu-1" and node["failure_domain"] == "rack-7" and node["taints"] == ["maintenance"]
    assert [g["pci"] for g in node["gpus"]] == ["0000:3b:00.0", "0000:3c:00.0"]
    assert "H200" in node["gpus"][0]["name"] and node["vm_driver"] == "dry-run"
    assert node["cpu_free"] == 12 and node["memory_free_gib"] == 100.5


# -- offline, readings, GPUs ----------------------------------------------------------------------

def _age(fabricd, node_id: str, seconds: float) -> None:
    store = fabricd["state"].store
    node = Node.model_validate_json(store.get(keyspace.nodes(node_id)).value)
    store.put(keyspace.nodes(node_id), node.model_copy(update={"last_heartbeat": time.time() - seconds})
              .model_dump_json())


def test_a_node_silent_for_60s_is_offline(fabricd, admin, node_a):
    with as_node(fabricd, node_a) as c:
        c.post("/api/ai/nodes", json=report("node-a"))
    _age(fabricd, "node-a", 30)
    assert admin.get("/api/ai/nodes/node-a").json()["phase"] == "Ready"
    _age(fabricd, "node-a", 61)
    view = admin.get("/api/ai/nodes/node-a").json()
    assert view["phase"] == "Offline" and view["online"] is False and "61s" in view["message"]
    with as_node(fabricd, node_a) as c:
        c.post("/api/ai/nodes/node-a/heartbeat", json=report("node-a"))
    assert admin.get("/api/ai/nodes/node-a").json()["online"] is True


def test_zero_readings_keep_what_fabricd_holds(fabricd, admin, node_a):
    with as_node(fabricd, node_a) as c:
        c.post("/api/ai/nodes/node-a/heartbeat", json=report(
            "node-a", gpus=[gpu("0000:3b:00.0", temperature_c=61, power_w=300, ecc_uncorrected=2).model_dump()]))
        # Bound to vfio-pci: nobody can read it, so everything fabricd holds stays.
        c.post("/api/ai/nodes/node-a/heartbeat", json=report("node-a", gpus=[
            gpu("0000:3b:00.0", readings_live=False, driver="vfio-pci").model_dump()]))
        g = admin.get("/api/ai/nodes/node-a").json()["gpus"][0]
        assert (g["temperature_c"], g["power_w"], g["ecc_uncorrected"]) == (61, 300, 2)
        # Live again: temperature/power 0 still mean "no sensor", but an ECC count of 0 is a real 0.
        c.post("/api/ai/nodes/node-a/heartbeat", json=report("node-a", gpus=[gpu("0000:3b:00.0").model_dump()]))
    g = admin.get("/api/ai/nodes/node-a").json()["gpus"][0]
    assert (g["temperature_c"], g["power_w"], g["ecc_uncorrected"]) == (61, 300, 0)


def test_gpus_show_allocation_from_reservations(fabricd, admin, node_a):
    with as_node(fabricd, node_a) as c:
        c.post("/api/ai/nodes/node-a/heartbeat", json=report(
            "node-a", gpus=[gpu("0000:3b:00.0").model_dump(), gpu("0000:3c:00.0").model_dump()]))
    fabricd["state"].store.put(keyspace.gpu_reservations("node-a", "0000:3c:00.0"),
                               json.dumps({"replica_id": "chat-0-x", "deployment": "chat"}))
    rows = {(g["node"], g["pci"]): g for g in admin.get("/api/ai/gpus").json()}
    assert rows[("node-a", "0000:3c:00.0")]["allocated_to"] == "chat-0-x"
    assert rows[("node-a", "0000:3b:00.0")]["allocated_to"] is None


def test_node_reads_and_certificates_need_admin(fabricd, node_a):
    with as_node(fabricd, node_a) as c:
        assert c.get("/api/ai/nodes").status_code == 401
        assert c.get("/api/ai/gpus").status_code == 401
        assert c.post("/api/ai/nodes/node-z/certificate", json={}).status_code == 401


def test_certificate_issue_rules(fabricd, admin):
    assert admin.post("/api/ai/nodes/fabricd/certificate", json={}).status_code == 409
    assert admin.post("/api/ai/nodes/Bad_Name/certificate", json={}).status_code == 422
    assert admin.post("/api/ai/nodes/node-k/certificate", json={}).status_code == 200
    # The node's private key goes to the caller only, not into fabricd's PKI directory.
    assert not (fabricd["dir"] / "pki" / "node-k.key").exists()


def test_merge_and_view_are_pure():
    stored = Node(id="n1", address="https://x:1", gpus=[gpu("0000:01:00.0", temperature_c=40)], last_heartbeat=1)
    merged = merge_report(stored, NodeReport(id="n1", address="https://x:1",
                                             gpus=[gpu("0000:01:00.0", power_w=90)]), now=100)
    assert merged.gpus[0].temperature_c == 40 and merged.gpus[0].power_w == 90 and merged.last_heartbeat == 100
    assert node_view(merged, 159.9).online and not node_view(merged, 160).online
    assert node_view(merged, 130, offline_after_s=20).phase == "Offline"
    assert "never" in node_view(Node(id="n2", address="https://x:1"), 5).message


# -- the control plane's agent client against a real agent -----------------------------------------

@pytest.fixture(scope="module")
def real_agent(admin, fabricd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent-b")
    crt, key, ca = node_files(admin, tmp, "node-b")
    driver = DryRunDriver(tmp / "dry")
    state = AgentState(node_id="node-b", vm_driver=driver,
                       inventory=NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(1))))
    tls = {"ssl_certfile": str(crt), "ssl_keyfile": str(key), "ssl_ca_certs": str(ca),
           "ssl_cert_reqs": int(ssl.CERT_REQUIRED), "http": PeerCertH11Protocol}
    with serve_in_thread(create_agent_app(state), **tls) as port:
        yield Node(id="node-b", address=f"https://127.0.0.1:{port}")
    for vm in driver.list():
        driver.delete(vm.id)


def test_agent_client_over_mtls(fabricd, real_agent):
    async def scenario():
        clients = AgentClients(fabricd["dir"])
        try:
            c = clients.for_node(real_agent)
            assert clients.for_node(real_agent) is c
            health = await c.health()
            assert health.node_id == "node-b" and health.gpus == 1
            assert (await c.list_gpus()).gpus[0].pci == "0000:3b:00.0"
            bound = await c.bind_gpu("0000:3b:00.0")  # dry-run never binds: says so
            assert bound.changed is False and "does not bind" in bound.message
            vm = await c.create_vm(VmCreateRequest(replica_id="d-0", deployment="d", model_name="m",
                                                   model_source="/models/m"))
            assert vm.id == "d-0" and vm.state in ("starting", "running")
            assert [v.id for v in await c.list_vms()] == ["d-0"]
            assert (await c.get_vm("d-0")).id == "d-0"
            assert await c.delete_vm("d-0") is True
            assert await c.delete_vm("d-0") is False
            assert await c.get_vm("d-0") is None
            with pytest.raises(Refused, match="dataplane"):
                await c.list_services()
        finally:
            await clients.aclose()

    asyncio.run(scenario())


def test_agent_client_unreachable_is_transient(fabricd):
    async def scenario():
        clients = AgentClients(fabricd["dir"])
        try:
            with pytest.raises(TransientError):
                await clients.for_address(f"https://127.0.0.1:{free_port()}").health()
        finally:
            await clients.aclose()

    asyncio.run(scenario())


def test_agent_refuses_a_client_from_another_ca(real_agent, tmp_path):
    issue_cert(tmp_path, "fabricd", server=True, client=True, role="fabricd")

    async def scenario():
        # A second cluster's fabricd: its own CA and client cert, trusting nothing of ours.
        clients = AgentClients(tmp_path)
        try:
            with pytest.raises(TransientError):
                await clients.for_node(real_agent).health()
        finally:
            await clients.aclose()

    asyncio.run(scenario())


# -- fabricctl --------------------------------------------------------------------------------------

def test_fabricctl_node_add_list_and_gpus(fabricd, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=fabricd["url"], FABRIC_CA=str(fabricd["ca"]), FABRIC_TOKEN=fabricd["token"],
               FABRIC_CONFIG_DIR=str(tmp_path / "cfg"))

    def ctl(*args):
        proc = subprocess.run([str(BIN / "fabricctl"), "ai", *args], capture_output=True, text=True,
                              env=env, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out_dir = tmp_path / "gpu-9-pki"
    ctl("node", "add", "gpu-9", "--out", str(out_dir), "--host", "10.0.0.9")
    assert oct((out_dir / "gpu-9.key").stat().st_mode & 0o777) == "0o600"
    files = (out_dir / "gpu-9.crt", out_dir / "gpu-9.key", out_dir / "ca.crt")
    with as_node(fabricd, files) as c:
        assert c.post("/api/ai/nodes", json=report("gpu-9", gpus=[gpu("0000:41:00.0").model_dump()])).status_code == 201
    listed = ctl("node", "list")
    assert "gpu-9" in listed and "Ready" in listed
    assert json.loads(ctl("node", "show", "gpu-9", "--json"))["id"] == "gpu-9"
    assert "0000:41:00.0" in ctl("gpus")


# -- insecure (lab) mode --------------------------------------------------------------------------

def test_insecure_loopback_fabricd_accepts_a_node_naming_itself(tmp_path):
    ensure_admin_password(tmp_path)
    store = SqliteStore(tmp_path / "fabric.db")
    insecure = AppState(store=store, state_dir=tmp_path, settings=FabricdSettings(insecure=True))
    strict = AppState(store=store, state_dir=tmp_path, settings=FabricdSettings(insecure=False))
    try:
        with serve_in_thread(create_app(insecure)) as port:
            r = httpx.post(f"http://127.0.0.1:{port}/api/ai/nodes", json=report("lab-node"), timeout=10)
            assert r.status_code == 201, r.text
        with serve_in_thread(create_app(strict)) as port:
            r = httpx.post(f"http://127.0.0.1:{port}/api/ai/nodes/lab-node/heartbeat", json=report("lab-node"),
                           timeout=10)
            assert r.status_code == 401
    finally:
        store.close()


def test_merge_ecc_returns_to_zero_when_live_and_is_kept_when_not():
    stored = Node(id="n1", address="https://x:1", last_heartbeat=1,
                  gpus=[gpu("0000:01:00.0", ecc_uncorrected=4, remapped_rows_pending=True)])
    live = merge_report(stored, NodeReport(id="n1", address="https://x:1", gpus=[gpu("0000:01:00.0")]), now=2)
    assert live.gpus[0].ecc_uncorrected == 0 and not live.gpus[0].remapped_rows_pending
    bound = merge_report(stored, NodeReport(id="n1", address="https://x:1", gpus=[
        gpu("0000:01:00.0", readings_live=False, driver="vfio-pci")]), now=2)
    assert bound.gpus[0].ecc_uncorrected == 4 and bound.gpus[0].remapped_rows_pending
    assert bound.gpus[0].driver == "vfio-pci"


# -- a compromised node (issue 40): what fabricd no longer takes from its report ---------------------

def test_fabricd_refuses_another_nodes_agent_at_a_reported_address(fabricd, real_agent):
    """node-c reports node-b's agent as its own address: fabricd's client is pinned to node-c's id,
    node-b's certificate does not name it, so nothing is sent there."""

    async def scenario():
        clients = AgentClients(fabricd["dir"])
        try:
            with pytest.raises(TransientError):
                await clients.for_node(Node(id="node-c", address=real_agent.address)).list_vms()
            assert (await clients.for_node(real_agent).health()).node_id == "node-b"  # its own still works
        finally:
            await clients.aclose()

    asyncio.run(scenario())


def test_a_nodes_address_and_site_are_fixed_after_registration(fabricd, admin, tmp_path):
    files = node_files(admin, tmp_path, "node-f", site="east")
    with as_node(fabricd, files) as c:
        assert c.post("/api/ai/nodes", json=report("node-f", site="east")).status_code == 201
        moved = c.post("/api/ai/nodes/node-f/heartbeat",
                       json={**report("node-f", site="east"), "address": "https://127.0.0.1:2379"})
        assert moved.status_code == 409 and moved.json()["error"]["code"] == "node_identity_fixed"
        assert "PUT /api/ai/nodes/node-f/identity" in moved.json()["error"]["message"]
        resited = c.post("/api/ai/nodes/node-f/heartbeat", json=report("node-f", site="west"))
        assert resited.status_code == 409
        assert c.post("/api/ai/nodes", json=report("node-f", site="west")).status_code == 409  # nor by re-registering
        assert c.post("/api/ai/nodes/node-f/heartbeat", json=report("node-f", site="east")).status_code == 200
    set_ = admin.put("/api/ai/nodes/node-f/identity", json={"site": "west", "replica_networks": ["10.77.0.0/16"]})
    assert set_.status_code == 200, set_.text
    assert set_.json()["site"] == "west" and set_.json()["replica_networks"] == ["10.77.0.0/16"]
    with as_node(fabricd, files) as c:
        beat = c.post("/api/ai/nodes/node-f/heartbeat", json=report("node-f", site="west"))
        assert beat.status_code == 200 and beat.json()["replica_networks"] == ["10.77.0.0/16"]  # kept
    bad = admin.put("/api/ai/nodes/node-f/identity", json={"replica_networks": ["not-a-cidr"]})
    assert bad.status_code == 422
    assert admin.put("/api/ai/nodes/node-f/identity", json={"address": "ftp://x"}).status_code == 422
    with as_node(fabricd, files) as c:  # a node may not change its own identity through the admin route
        assert c.put("/api/ai/nodes/node-f/identity", json={"site": "east"}).status_code == 401
