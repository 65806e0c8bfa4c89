"""Only the control plane may call an agent: over real mutual TLS on loopback, a certificate
from the cluster CA is not enough, its CN must be an allowed caller (default ``fabricd``).

Every node holds a cluster-CA certificate, so without this check node B could create VMs on,
bind GPUs of, or reprogram the Maglev maps of node A.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from agent.api import DEFAULT_ALLOWED_CLIENT_CNS, caller_refusal, create_app
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.state import AgentState
from agent.vm.dryrun_driver import DryRunDriver
from common.peer_cert import CN_KEY, ROLE_KEY, TLS_EXT, PeerCertH11Protocol
from common.pki import client_ssl_context, ensure_ca, issue_cert, pki_dir
from lab.rigs.polling import wait_for
from lab.rigs.servers import free_port, serve_in_thread
from tests.integration.orchestration_harness import agent_command, clean_env

NODE = "node-a"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """One cluster CA: the agent's node cert, fabricd's client cert, another node's, an operator's."""
    state = tmp_path_factory.mktemp("cluster")
    ensure_ca(state)
    issue_cert(state, NODE, server=True, client=True, role="node")
    issue_cert(state, "fabricd", server=True, client=True, role="fabricd")
    issue_cert(state, "node-b", server=True, client=True, role="node")
    issue_cert(state, "ops", server=False, client=True, role="tool")
    return pki_dir(state)


def mtls(pki: Path, **extra) -> dict:
    return {"ssl_certfile": str(pki / f"{NODE}.crt"), "ssl_keyfile": str(pki / f"{NODE}.key"),
            "ssl_ca_certs": str(pki / "ca.crt"), "ssl_cert_reqs": int(ssl.CERT_REQUIRED), **extra}


def as_caller(pki: Path, url: str, cn: str) -> httpx.Client:
    ctx = client_ssl_context(pki / "ca.crt", pki / f"{cn}.crt", pki / f"{cn}.key")
    return httpx.Client(base_url=url, verify=ctx, timeout=10)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = DryRunDriver(tmp_path_factory.mktemp("agent") / "dry-run")
    yield d
    for vm in d.list():
        d.delete(vm.id)


def agent_state(driver) -> AgentState:
    return AgentState(node_id=NODE, vm_driver=driver, inventory=NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(1))))


@pytest.fixture(scope="module")
def agent_url(pki, driver):
    """The agent app with its default policy, served as `fabric-agent serve` serves it."""
    with serve_in_thread(create_app(agent_state(driver)), **mtls(pki, http=PeerCertH11Protocol)) as port:
        yield f"https://127.0.0.1:{port}"


def test_the_control_plane_certificate_is_admitted(pki, agent_url):
    assert DEFAULT_ALLOWED_CLIENT_CNS == ("fabricd",)
    with as_caller(pki, agent_url, "fabricd") as c:
        r = c.get("/v1/health")
        assert r.status_code == 200 and r.json()["node_id"] == NODE


def test_another_nodes_certificate_gets_403_with_a_clear_message(pki, agent_url, driver):
    with as_caller(pki, agent_url, "node-b") as c:
        r = c.get("/v1/health")
        assert r.status_code == 403
        err = r.json()["error"]
        assert err["code"] == "caller_not_allowed"
        assert "'node-b'" in err["message"] and "fabricd" in err["message"]
        assert "--allowed-client-cn" in err["message"]
        # Nothing that changes the node gets through either.
        create = c.post("/v1/vms", json={"replica_id": "x-0", "deployment": "x", "model_name": "m",
                                         "model_source": "/models/m"})
        assert create.status_code == 403
        assert c.post("/v1/gpus/0000:3b:00.0/bind").status_code == 403
        assert c.put("/v1/maglev/services/10.96.0.1/8000/tcp", json={"backends": {}}).status_code == 403
        assert c.get("/metrics").status_code == 403
    assert driver.get("x-0") is None or driver.get("x-0").state == "absent"


def test_refused_callers_are_counted(pki, agent_url):
    with as_caller(pki, agent_url, "node-b") as c:
        c.get("/v1/gpus")
    with as_caller(pki, agent_url, "fabricd") as c:
        text = c.get("/metrics").text
    assert 'fabric_agent_requests_total{code="403",route="unmatched"}' in text


def test_extra_allowed_callers(pki, driver):
    app = create_app(agent_state(driver), allowed_client_cns=["fabricd", "ops"])
    with serve_in_thread(app, **mtls(pki, http=PeerCertH11Protocol)) as port:
        url = f"https://127.0.0.1:{port}"
        with as_caller(pki, url, "ops") as c:
            assert c.get("/v1/gpus").status_code == 200
        with as_caller(pki, url, "node-b") as c:
            assert c.get("/v1/gpus").status_code == 403


def test_an_agent_that_cannot_see_certificates_admits_nobody(pki, driver):
    """Served without PeerCertH11Protocol the app cannot tell fabricd from a node: it refuses."""
    with serve_in_thread(create_app(agent_state(driver)), **mtls(pki)) as port, \
            as_caller(pki, f"https://127.0.0.1:{port}", "fabricd") as c:
        r = c.get("/v1/health")
    assert r.status_code == 403 and "PeerCertH11Protocol" in r.json()["error"]["message"]


def test_caller_refusal_is_a_pure_rule():
    def scope(scheme, cn=None, tls=True, role="fabricd"):
        ext = {TLS_EXT: {CN_KEY: cn, ROLE_KEY: role}} if tls else {}
        return {"scheme": scheme, "extensions": ext}

    allowed = {"fabricd"}
    assert caller_refusal(scope("https", "fabricd"), allowed) is None
    assert "node-b" in caller_refusal(scope("https", "node-b"), allowed)
    assert "required" in caller_refusal(scope("https", None), allowed)
    assert "cannot see" in caller_refusal(scope("https", tls=False), allowed)
    assert caller_refusal(scope("http", tls=False), allowed) is None  # --insecure: loopback only
    assert "nobody" in caller_refusal(scope("https", "fabricd"), set())


def test_fabric_agent_serve_takes_repeatable_allowed_client_cn(pki, tmp_path):
    port = free_port()
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            agent_command() + ["--node-id", NODE, "--listen", f"127.0.0.1:{port}", "--pki-dir", str(pki),
                               "--allowed-client-cn", "fabricd", "--allowed-client-cn", "ops",
                               "--vm-driver", "dry-run", "--fake-gpus", "1", "--no-dataplane",
                               "--state-dir", str(tmp_path / "state"), "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, env=clean_env({}))
    url = f"https://127.0.0.1:{port}"
    try:
        def answers() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                with as_caller(pki, url, "fabricd") as c:
                    assert c.get("/v1/health").status_code == 200
                return True
            except httpx.TransportError:
                return False

        wait_for(answers, 30, f"the agent at {url} to answer (log: {log})", interval=0.2)
        with as_caller(pki, url, "ops") as c:
            assert c.get("/v1/health").status_code == 200
        with as_caller(pki, url, "node-b") as c:
            r = c.get("/v1/health")
            assert r.status_code == 403 and r.json()["error"]["code"] == "caller_not_allowed"
    finally:
        proc.terminate()
        proc.wait(15)
