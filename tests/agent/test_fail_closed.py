"""Fail-closed sites (agent.fail_closed): a real fabricd (its app over mutual TLS, SQLite store)
answers the agent's heartbeats with its site's fail_closed_unix; the agent's real API (mutual TLS)
over an in-memory dataplane withdraws its Maglev services once the heartbeat has gone unanswered
for the window, refuses new ones while cut off, says so in /v1/health, /metrics and its next
report, and takes fabricd's pushes again when the link is back. "The last answered heartbeat was
31 s ago" is set on the guard, never waited for."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import httpx
import pytest

from agent.api import create_app
from agent.fail_closed import FailClosed, decide
from agent.heartbeat import Heartbeat, HostResources
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.state import AgentState
from agent.vm.dryrun_driver import DryRunDriver
from common.peer_cert import PeerCertH11Protocol
from common.pki import client_ssl_context, pki_dir
from lab.rigs.memory_dataplane import MemoryDataplane
from lab.rigs.servers import free_port, serve_in_thread
from tests.controlplane import test_nodes_mtls as mtls
from tests.controlplane.test_nodes_mtls import as_node

SERVICE = "/v1/maglev/services/10.96.0.7/8000/tcp"
SPEC = {"backends": {"10.0.0.1:8000": 32}}


def test_decide():
    assert decide(None, 0.0, 1000.0, 30) == ""  # fail-open site: serve forever
    assert decide(0.0, None, 1000.0, 30) == ""  # no heartbeat answered yet: the setting is unknown
    assert decide(0.0, 970.0, 1000.0, 30) == ""  # within the window
    assert "withdrawn" in decide(0.0, 969.0, 1000.0, 30)
    assert decide(2000.0, 0.0, 1000.0, 30) == ""  # may serve its snapshot until 2000
    assert decide(2000.0, 0.0, 2000.0, 30) != ""


def _node_files(admin, tmp: Path, node_id: str, site: str) -> tuple[Path, Path, Path]:
    """The node's certificate granted in `site`, as `fabricctl ai node add --site` issues it."""
    r = admin.post(f"/api/ai/nodes/{node_id}/certificate", json={"hosts": ["127.0.0.1"], "site": site})
    assert r.status_code == 200, r.text
    out = []
    for name, field in ((f"{node_id}.crt", "cert_pem"), (f"{node_id}.key", "key_pem"), ("ca.crt", "ca_pem")):
        (tmp / name).write_text(r.json()[field])
        out.append(tmp / name)
    return out[0], out[1], out[2]


@pytest.fixture(scope="module")
def fabricd(tmp_path_factory):
    """The real fabricd of tests/controlplane/test_nodes_mtls.py (its app over mutual TLS)."""
    yield from mtls.fabricd.__wrapped__(tmp_path_factory)


@pytest.fixture(scope="module")
def admin(fabricd):
    yield from mtls.admin.__wrapped__(fabricd)


@pytest.fixture
def node(fabricd, admin, tmp_path, request):
    """One agent on site request.param: its API served over mutual TLS with the node certificate
    fabricd issued, called with fabricd's certificate; its heartbeat to the real fabricd."""
    site, fail_closed_unix = request.param
    r = admin.post("/api/ai/sites", json={"name": site, "fail_closed_unix": fail_closed_unix})
    assert r.status_code in (200, 201), r.text
    node_id = f"node-{site}"
    files = _node_files(admin, tmp_path, node_id, site)
    dp = MemoryDataplane()
    state = AgentState(node_id=node_id, vm_driver=DryRunDriver(tmp_path / "dry"), site=site,
                       inventory=NvmlInventory(nvml_module=FakeNvml(gpus=make_gpus(1, "h100"))), dataplane=dp)
    state.fail_closed = FailClosed(dp, window_s=30)
    crt, key, ca = files
    tls = {"ssl_certfile": str(crt), "ssl_keyfile": str(key), "ssl_ca_certs": str(ca),
           "ssl_cert_reqs": int(ssl.CERT_REQUIRED), "http": PeerCertH11Protocol}
    pki = pki_dir(fabricd["dir"])  # fabricd's own client certificate calls the agent, as fabricd does
    as_fabricd = client_ssl_context(ca, pki / "fabricd.crt", pki / "fabricd.key")
    with serve_in_thread(create_app(state), **tls) as port, as_node(fabricd, files) as link, \
            httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=as_fabricd, timeout=10) as agent_api:
        beat = Heartbeat(state, link, f"https://127.0.0.1:{port}", resources=lambda: HostResources(8, 64))
        yield {"state": state, "dp": dp, "beat": beat, "api": agent_api, "link": link, "id": node_id}


def _cut(node) -> None:
    """The link to fabricd goes down (nothing listens where the heartbeat now goes), and the last
    answered heartbeat is older than the window."""
    node["beat"].client = httpx.Client(base_url=f"https://127.0.0.1:{free_port()}", timeout=2)
    node["state"].fail_closed.last_ok = time.time() - 31


@pytest.mark.parametrize("node", [("edge", 0)], indirect=True)
def test_a_fail_closed_site_withdraws_while_cut_off_and_serves_again_after(node, admin):
    beat, api, dp = node["beat"], node["api"], node["dp"]
    beat.tick()
    assert beat.last_error == "" and node["state"].fail_closed.fail_closed_unix == 0
    assert api.put(SERVICE, json=SPEC).status_code == 200
    _cut(node)
    beat.tick()
    assert dp.services == {} and api.get("/v1/maglev/services").json()["services"] == []
    health = api.get("/v1/health").json()
    assert "fail-closed" in health["services_withdrawn"] and "fail-closed" in health["message"]
    assert "fabric_agent_fail_closed 1.0" in api.get("/metrics").text
    refused = api.put(SERVICE, json=SPEC)  # a push that still reaches the agent is refused too
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "fail_closed"
    assert dp.services == {}

    beat.client = node["link"]  # the link is back: the report tells fabricd the services went
    beat.tick()
    seen = admin.get(f"/api/ai/nodes/{node['id']}").json()
    assert "fail-closed" in seen["services_withdrawn"]
    assert api.put(SERVICE, json=SPEC).status_code == 200  # fabricd's push (test_routing_controller)
    assert dp.services and api.get("/v1/health").json()["services_withdrawn"] == ""
    assert "fabric_agent_fail_closed 0.0" in api.get("/metrics").text
    beat.tick()
    assert admin.get(f"/api/ai/nodes/{node['id']}").json()["services_withdrawn"] == ""


@pytest.mark.parametrize("node", [("open", None), ("later", 4_000_000_000)], indirect=True)
def test_a_fail_open_site_or_one_still_in_its_grace_keeps_serving(node):
    beat, api, dp = node["beat"], node["api"], node["dp"]
    beat.tick()
    assert api.put(SERVICE, json=SPEC).status_code == 200
    _cut(node)
    beat.tick()
    assert list(dp.services) == [("10.96.0.7", 8000, "tcp")]
    assert api.get("/v1/health").json()["services_withdrawn"] == ""
    assert api.put(SERVICE, json=SPEC).status_code == 200
