"""The agent API over real mutual TLS on loopback: fake NVML + fake sysfs GPUs (the same
inventory and VFIO code as on a GPU host), the dry-run driver starting real engine-sim
processes, and an in-memory dataplane standing in for the BPF maps where the real one is absent.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from agent.api import create_app
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.hw.sysfs_fake import FakeSysfs
from agent.hw.vfio import VfioBinder
from agent.server_cli import advertised_address, tls_plan
from agent.state import AgentState
from agent.vm.dryrun_driver import DryRunDriver
from common.peer_cert import PeerCertH11Protocol
from common.pki import client_ssl_context, ensure_ca, issue_cert
from lab.rigs.memory_dataplane import MemoryDataplane
from lab.rigs.polling import wait_for
from lab.rigs.servers import serve_in_thread
from tests.support.agent_ops import finished

NODE = "node-a"


def agent_tls(pki_state: Path) -> dict:
    ca, _ = ensure_ca(pki_state)
    crt, key = issue_cert(pki_state, NODE, server=True, client=True, role="node", hosts=["127.0.0.1", "localhost"])
    # As `fabric-agent serve` serves: the protocol shows the client certificate to the app.
    return {"ssl_certfile": str(crt), "ssl_keyfile": str(key), "ssl_ca_certs": str(ca),
            "ssl_cert_reqs": int(ssl.CERT_REQUIRED), "http": PeerCertH11Protocol}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster PKI, plus a second CA that must never be trusted."""
    base = tmp_path_factory.mktemp("pki")
    tls = agent_tls(base / "cluster")
    fabricd_crt, fabricd_key = issue_cert(base / "cluster", "fabricd", server=True, client=True, role="fabricd")
    other_crt, other_key = issue_cert(base / "other", "fabricd", server=False, client=True, role="fabricd")
    return {"tls": tls, "ca": Path(tls["ssl_ca_certs"]), "client": (fabricd_crt, fabricd_key),
            "other": (other_crt, other_key)}


@pytest.fixture(scope="module")
def agent(cluster, tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("agent")
    inventory = NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(2, "h100")))
    fake = FakeSysfs(state_dir / "sysfs")
    for i, gpu in enumerate(inventory.read().gpus):
        fake.add_gpu(gpu.pci, group=30 + i, audio=True, sriov_total=4)
    driver = DryRunDriver(state_dir / "dry-run")
    state = AgentState(node_id=NODE, vm_driver=driver, inventory=inventory,
                       binder=VfioBinder(fake.root, kernel=fake.kernel), dataplane=MemoryDataplane())
    with serve_in_thread(create_app(state), **cluster["tls"]) as port:
        yield {"url": f"https://127.0.0.1:{port}", "state": state, "sysfs": fake, "driver": driver}
    for vm in driver.list():
        driver.delete(vm.id)


@pytest.fixture
def client(agent, cluster):
    ctx = client_ssl_context(cluster["ca"], *cluster["client"])
    with httpx.Client(base_url=agent["url"], verify=ctx, timeout=10) as c:
        yield c


# -- TLS --------------------------------------------------------------------------------------------

def test_a_client_without_a_certificate_is_refused(agent, cluster):
    with pytest.raises(httpx.TransportError), httpx.Client(verify=client_ssl_context(cluster["ca"]), timeout=5) as c:
        c.get(agent["url"] + "/v1/health")


def test_a_certificate_from_another_ca_is_refused(agent, cluster):
    ctx = client_ssl_context(cluster["ca"], *cluster["other"])
    with pytest.raises(httpx.TransportError), httpx.Client(verify=ctx, timeout=5) as c:
        c.get(agent["url"] + "/v1/health")


def test_plain_http_to_the_tls_port_gets_no_api(agent):
    with pytest.raises(httpx.HTTPError), httpx.Client(timeout=5) as c:
        r = c.get(agent["url"].replace("https", "http") + "/v1/health")
        r.raise_for_status()


def test_health_with_a_cluster_certificate(client):
    r = client.get("/v1/health")
    assert r.status_code == 200
    body = r.json()
    assert body["node_id"] == NODE and body["ok"] and body["vm_driver"] == "dry-run"
    assert body["gpus"] == 2 and body["dataplane"] is True


# -- GPUs -------------------------------------------------------------------------------------------

def test_gpus_list_the_fake_h100s_in_sysfs_form(client):
    body = client.get("/v1/gpus").json()
    pcis = [g["pci"] for g in body["gpus"]]
    assert pcis == ["0000:3b:00.0", "0000:3c:00.0"]
    assert all("H100" in g["name"] and g["memory_total_mib"] > 80_000 for g in body["gpus"])


def test_bind_and_release_move_the_driver_and_are_idempotent(client, agent):
    bdf = "0000:3b:00.0"
    op = finished(client, client.post(f"/v1/gpus/{bdf}/bind"))
    assert op["kind"] == "gpu-bind" and op["state"] == "succeeded" and op["target"] == bdf, op
    first = op["gpu"]
    assert first["driver"] == "vfio-pci" and first["changed"] is True
    assert sorted(first["functions"]) == [bdf, "0000:3b:00.1"]
    assert agent["sysfs"].driver_of(bdf) == "vfio-pci"
    again = finished(client, client.post(f"/v1/gpus/{bdf}/bind"))["gpu"]
    assert again["changed"] is False and again["driver"] == "vfio-pci"
    released = finished(client, client.post(f"/v1/gpus/{bdf}/release"))["gpu"]
    assert released["driver"] == "nvidia" and released["changed"] is True
    assert agent["sysfs"].driver_of("0000:3b:00.1") == "snd_hda_intel"


def test_bind_refusal_is_a_400_with_the_reason(client, agent):
    bdf = "0000:3c:00.0"
    agent["sysfs"].set_sriov(bdf, 2)
    try:
        op = finished(client, client.post(f"/v1/gpus/{bdf}/bind"))
        assert op["state"] == "failed" and op["error"]["status"] == 400
        assert op["error"]["code"] == "refused"
        assert "virtual function" in op["error"]["message"].lower() or "sr-iov" in op["error"]["message"].lower()
    finally:
        agent["sysfs"].set_sriov(bdf, 0)


def test_bad_and_unknown_pci_addresses(client):
    bad = client.post("/v1/gpus/3b:00.0/bind")
    assert bad.status_code == 422 and "0000:bb:dd.f" in bad.json()["error"]["message"]
    unknown = client.post("/v1/gpus/0000:99:00.0/bind")
    assert unknown.status_code == 404 and "0000:99:00.0" in unknown.json()["error"]["message"]


# -- VMs (dry-run: real engine-sim processes) ---------------------------------------------------------

def _wait_running(client, vm_id: str) -> dict:
    def running() -> dict | None:
        vm = client.get(f"/v1/vms/{vm_id}").json()
        assert vm["state"] in ("running", "starting"), vm
        return vm if vm["state"] == "running" else None

    return wait_for(running, 30, f"{vm_id} to become running", interval=0.1)


def test_vm_lifecycle_runs_a_real_engine(client):
    body = {"replica_id": "chat-0-abc", "deployment": "chat", "model_name": "qwen-test",
            "model_source": "hf://Qwen/Qwen2-0.5B", "engine_args": {"tokens_per_s": "500"}}
    created = finished(client, client.post("/v1/vms", json=body))
    assert created["state"] == "succeeded" and created["vm"]["id"] == "chat-0-abc", created
    vm = _wait_running(client, "chat-0-abc")
    assert vm["host"] == "127.0.0.1"
    engine = httpx.get(f"http://127.0.0.1:{vm['port']}/v1/models", timeout=10).json()
    assert [m["id"] for m in engine["data"]] == ["qwen-test"]
    # Create is idempotent by replica id: same engine, same port.
    assert finished(client, client.post("/v1/vms", json=body))["vm"]["port"] == vm["port"]
    assert [v["id"] for v in client.get("/v1/vms").json()["vms"]] == ["chat-0-abc"]
    assert finished(client, client.delete("/v1/vms/chat-0-abc"))["state"] == "succeeded"
    assert client.get("/v1/vms/chat-0-abc").status_code == 404
    gone = finished(client, client.delete("/v1/vms/chat-0-abc"))
    assert gone["state"] == "failed" and gone["error"]["status"] == 404
    assert client.get("/v1/operations/no-such-op").status_code == 404
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{vm['port']}/health", timeout=2)


def test_vm_create_validation_names_the_field(client):
    r = client.post("/v1/vms", json={"replica_id": "Bad/Id", "deployment": "chat", "model_name": "m",
                                     "model_source": "/models/m"})
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid" and "replica_id" in r.json()["error"]["message"]
    r = client.post("/v1/vms", json={"replica_id": "ok-1", "deployment": "chat", "model_name": "m",
                                     "model_source": "/models/m", "engine_args": {"x": "--evil"}})
    assert r.status_code == 422 and "engine_args" in r.json()["error"]["message"]


# -- Maglev -----------------------------------------------------------------------------------------

def test_maglev_service_put_get_list_delete(client):
    path = "/v1/maglev/services/10.200.0.10/8000/tcp"
    spec = {"backends": {"10.0.0.2:8000": 32, "10.0.0.3:8000": 1}, "draining": ["10.0.0.3:8000"]}
    put = client.put(path, json=spec)
    assert put.status_code == 200, put.text
    got = client.get(path).json()
    assert got["backends"] == spec["backends"] and got["draining"] == ["10.0.0.3:8000"]
    assert got["forwarding"] == "nat"  # the default
    assert client.put(path, json=spec | {"forwarding": "dsr-ipip"}).json()["forwarding"] == "dsr-ipip"
    assert [s["vip"] for s in client.get("/v1/maglev/services").json()["services"]] == ["10.200.0.10"]
    assert client.delete(path).status_code == 204
    assert client.get(path).status_code == 404
    assert client.delete(path).status_code == 404


@pytest.mark.parametrize("path,spec,needle", [
    ("/v1/maglev/services/10.200.0.10/8000/tcp", {"backends": {"10.0.0.2:8000": 33}}, "0-32"),
    ("/v1/maglev/services/10.200.0.10/8000/tcp", {"backends": {"host:80": 1}}, "IPv4:PORT"),
    ("/v1/maglev/services/not-an-ip/8000/tcp", {"backends": {}}, "vip"),
    ("/v1/maglev/services/10.200.0.10/8000/sctp", {"backends": {}}, "proto"),
    ("/v1/maglev/services/10.200.0.10/8000/tcp", {"backends": {"10.0.0.2:80": 1}, "draining": ["10.0.0.9:80"]},
     "draining"),
    ("/v1/maglev/services/10.200.0.10/8000/tcp", {"backends": {}, "forwarding": "dsr"}, "forwarding"),
])
def test_maglev_bad_input_is_422_naming_it(client, path, spec, needle):
    r = client.put(path, json=spec)
    assert r.status_code == 422
    assert needle in r.json()["error"]["message"]


def test_metrics_count_requests_by_route_template(client):
    client.get("/v1/vms/does-not-exist")
    text = client.get("/metrics").text
    assert 'fabric_agent_requests_total{code="404",route="/v1/vms/{vm_id}"}' in text
    assert "does-not-exist" not in text


# -- serve options (pure) ---------------------------------------------------------------------------

def test_tls_plan_refuses_to_run_without_tls_unless_insecure_on_loopback(tmp_path):
    assert "no TLS files" in tls_plan(NODE, "0.0.0.0", False, None, None, None, None).refusal
    assert "loopback" in tls_plan(NODE, "0.0.0.0", True, None, None, None, None).refusal
    ok = tls_plan(NODE, "127.0.0.1", True, None, None, None, None)
    assert ok.refusal is None and not ok.enabled
    assert "all of" in tls_plan(NODE, "0.0.0.0", False, tmp_path / "a", None, None, None).refusal
    assert "not found" in tls_plan(NODE, "0.0.0.0", False, None, None, None, tmp_path).refusal
    for name in (f"{NODE}.crt", f"{NODE}.key", "ca.crt"):
        (tmp_path / name).write_text("x")
    plan = tls_plan(NODE, "0.0.0.0", False, None, None, None, tmp_path)
    assert plan.enabled and plan.ca == tmp_path / "ca.crt"
    assert "--insecure" in tls_plan(NODE, "127.0.0.1", True, None, None, None, tmp_path).refusal


def test_advertised_address():
    assert advertised_address("10.1.2.3", 9443, True, None) == "https://10.1.2.3:9443"
    assert advertised_address("127.0.0.1", 9443, False, None) == "http://127.0.0.1:9443"
    assert advertised_address("0.0.0.0", 1, True, "https://gpu-7:9443/") == "https://gpu-7:9443"


# -- the real BPF dataplane behind the API ------------------------------------------------------------

def test_maglev_api_over_the_real_bpf_maps(cluster, tmp_path, plain_plane):
    from agent.dataplane import Dataplane

    # the session's compiled maps (no compile of its own), opened as the CLI does
    dp = Dataplane(pin_dir=plain_plane.pin_dir, programs=False)
    state = AgentState(node_id=NODE, vm_driver=DryRunDriver(tmp_path / "dry"),
                       inventory=NvmlInventory(nvml_module=FakeNvml(gpus=[])), dataplane=dp)
    try:
        with serve_in_thread(create_app(state), **cluster["tls"]) as port, httpx.Client(
                base_url=f"https://127.0.0.1:{port}", timeout=10,
                verify=client_ssl_context(cluster["ca"], *cluster["client"])) as c:
            path = "/v1/maglev/services/10.77.0.1/8000/tcp"
            put = c.put(path, json={"backends": {"10.1.0.11:8000": 1, "10.1.0.12:8000": 3},
                                    "draining": ["10.1.0.11:8000"]})
            assert put.status_code == 200, put.text
            view = c.get(path).json()
            assert view["backends"] == {"10.1.0.11:8000": 1, "10.1.0.12:8000": 3}
            assert view["draining"] == ["10.1.0.11:8000"]
            slots = {s["address"]: s["slots"] for s in view["stats"]}
            # A draining backend takes no new flows: it owns no slot of the active table.
            assert slots["10.1.0.11:8000"] == 0 and slots["10.1.0.12:8000"] == 65537
            assert {s["address"]: s["active_flows"] for s in view["stats"]} == {"10.1.0.11:8000": 0,
                                                                                 "10.1.0.12:8000": 0}
            # a VIP that is an address of this node is refused, naming why
            refused = c.put("/v1/maglev/services/127.0.0.1/8000/tcp", json={"backends": {"10.1.0.11:8000": 1}})
            assert refused.status_code in (400, 422) and "address of this node" in refused.text
            metrics = c.get("/metrics").text
            assert 'fabric_dataplane_flow_misses_total{kind="syn",port="8000",proto="tcp",vip="10.77.0.1"} 0.0' \
                in metrics
            assert 'fabric_dataplane_verdicts_total{verdict="fwd_new_flow"}' in metrics
            assert c.delete(path).status_code == 204
            assert c.get(path).status_code == 404
    finally:
        dp.close()


def test_a_405_allows_every_method_the_path_serves(client):
    resp = client.request("OPTIONS", "/v1/vms")
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
    assert {"GET", "POST"} <= set(resp.headers["allow"].split(", "))
