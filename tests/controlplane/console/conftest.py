"""A real fabricd for the console tests: TLS (the session cookie is Secure), dry-run replicas with
the controllers running (so scaling really changes the replica count), seeded through the REST API
with a model, a profile, two deployments (one autoscaled), an endpoint and one registered node
(mTLS, as an agent registers) with two GPU readings and a MIG slice on the first.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest

from common.agent_api import NodeReport
from common.pki import client_ssl_context
from common.schemas import GpuInfo
from lab.rigs.polling import wait_for
from tests.controlplane.conftest import Fabricd, login, start_fabricd

CONSOLE = "/app/ai"
WAIT_S = 60.0


@dataclass
class Cluster:
    server: Fabricd
    admin_token: str
    viewer_password: str

    @property
    def url(self) -> str:
        return self.server.url

    def api(self) -> httpx.Client:
        return self.server.client(self.admin_token)


def _seed(server: Fabricd, api: httpx.Client, tmp) -> None:
    for path, body in (
        ("/api/ai/models", {"name": "chat", "source": "hf://Qwen/Qwen3-8B"}),
        ("/api/ai/profiles", {"name": "h100-1", "runtime": "vllm", "gpu": {"count": 1, "vram_gib": 24},
                              "cpu": 1, "memory_gib": 1}),
        ("/api/ai/deployments", {"name": "chat", "model": "chat", "profile": "h100-1", "replicas": 3}),
        ("/api/ai/deployments", {"name": "chat-auto", "model": "chat", "profile": "h100-1", "replicas": 1,
                                 "autoscaling": {"min_replicas": 1, "max_replicas": 2}}),
        ("/api/ai/endpoints", {"name": "chat-openai", "deployment": "chat", "routing": "least_queue"}),
    ):
        r = api.post(path, json=body)
        assert r.status_code == 201, r.text
    issued = api.post("/api/ai/nodes/gpu-node-1/certificate", json={"hosts": ["127.0.0.1"]}).json()
    files = {}
    for name, field in (("n.crt", "cert_pem"), ("n.key", "key_pem"), ("ca.crt", "ca_pem")):
        files[name] = tmp / name
        files[name].write_text(issued[field])
    gpus = [GpuInfo(index=i, uuid=f"GPU-{i}", name="NVIDIA H100", pci=f"0000:3b:0{i}.0", memory_total_mib=81559,
                    memory_used_mib=1024 * (i + 1), temperature_c=41 + i, power_w=120 + i, ecc_uncorrected=i,
                    mig_mode=i == 0)
            for i in range(2)]
    report = NodeReport(id="gpu-node-1", address="https://127.0.0.1:9443", gpus=gpus, cpu_free=32,
                        memory_free_gib=256, vm_driver="dry-run").model_dump(mode="json")
    ctx = client_ssl_context(files["ca.crt"], files["n.crt"], files["n.key"])
    with httpx.Client(base_url=server.url, verify=ctx, timeout=10) as node:
        r = node.post("/api/ai/nodes", json=report)
        assert r.status_code in (200, 201), r.text
    r = api.post("/api/ai/nodes/gpu-node-1/mig", json={"parent_bdf": "0000:3b:00.0", "profile": "1g.10gb"})
    assert r.status_code == 201, r.text  # a simulated node's slice is a record
    wait_for(lambda: api.get("/api/ai/deployments/chat").json()["status"].get("ready_replicas") == 3,
             WAIT_S, "3 ready chat replicas", interval=0.2)
    wait_for(lambda: api.get("/api/ai/endpoints/chat-openai").json()["status"].get("vip"),
             WAIT_S, "a VIP on chat-openai", interval=0.2)
    wait_for(lambda: any(e["weight"] for e in api.get("/api/ai/explain/routing/chat-openai").json()["replicas"]),
             WAIT_S, "routing weights", interval=0.2)


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    env = {"FABRIC_DRY_RUN": "1", "FABRIC_KEY_HMAC_SECRET": "console-test-hmac-secret-0123456789"}
    with start_fabricd(tmp, insecure=False, env=env, controllers=True) as server:
        token = login(server)
        with server.client(token) as api:
            _seed(server, api, tmp)
        yield Cluster(server, token, (server.state_dir / "viewer-password").read_text().strip())


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field on the page"
    return m.group(1)


@contextmanager
def signed_in(cluster: Cluster, username: str = "admin", password: str | None = None):
    """An httpx client holding a console session, signed in through the real sign-in form."""
    with cluster.server.client() as client:
        yield _sign_in(cluster, client, username, password)


def _sign_in(cluster: Cluster, client: httpx.Client, username: str, password: str | None) -> httpx.Client:
    form = client.get(f"{CONSOLE}/login")
    assert form.status_code == 200
    pw = password if password is not None else (cluster.server.password if username == "admin"
                                                 else cluster.viewer_password)
    r = client.post(f"{CONSOLE}/login", data={"username": username, "password": pw, "csrf": csrf_of(form.text)})
    assert r.status_code == 303, r.text
    return client
