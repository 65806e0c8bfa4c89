"""Node join over real HTTPS on loopback: two fabricd (the real app, one SQLite store, TLS with
optional client certificates as `fabricd serve` runs) and the agent's join, renewal and
control-plane failover code.

An admin makes a one-time, short-lived join token; the agent checks the downloaded CA against
the token's hash, trades the token for a certificate over a key it made itself, registers and
heartbeats with it over mutual TLS, renews it with itself, and keeps heartbeating when the
fabricd it used goes away. The store holds only the token secret's hash.
"""

from __future__ import annotations

import datetime
import hashlib
import stat
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from cryptography import x509

from agent.control_plane import FailoverClient, split_urls
from agent.heartbeat import Heartbeat, HostResources
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.nvml_fake import FakeNvml
from agent.join import JoinFailed, join, node_files, renew, renewal_due
from agent.state import AgentState
from agent.vm.dryrun_driver import DryRunDriver
from common.errors import Unauthorized
from common.pki import client_ssl_context, ensure_ca, issue_cert
from common.store.sqlite_store import SqliteStore
from controlplane import join_tokens
from controlplane.app import create_app
from controlplane.auth import ensure_admin_password
from controlplane.node_identity import uvicorn_tls_kwargs
from controlplane.settings import FabricdSettings
from controlplane.state import AppState
from lab.rigs.servers import free_port, serve_in_thread


@pytest.fixture
def cluster(tmp_path):
    state_dir = tmp_path / "fabricd"
    ensure_admin_password(state_dir)
    ca, _ = ensure_ca(state_dir)
    crt, key = issue_cert(state_dir, "fabricd", server=True, client=True, role="fabricd")
    store = SqliteStore(state_dir / "fabric.db")
    stacks = [ExitStack(), ExitStack()]
    urls = []
    for stack in stacks:  # two fabricd over one store, as three would be over one etcd
        app = create_app(AppState(store=store, state_dir=state_dir, settings=FabricdSettings()))
        port = stack.enter_context(serve_in_thread(app, **uvicorn_tls_kwargs(crt, key, ca)))
        urls.append(f"https://127.0.0.1:{port}")
    with httpx.Client(base_url=urls[0], verify=client_ssl_context(ca), timeout=10) as c:
        token = c.post("/api/auth/login", json={"username": "admin", "password": (
            state_dir / "admin-password").read_text().strip()}).json()["token"]
    admin = httpx.Client(base_url=urls[0], verify=client_ssl_context(ca), timeout=10,
                         headers={"Authorization": f"Bearer {token}"})
    try:
        yield {"urls": urls, "stacks": stacks, "admin": admin, "store": store, "dir": state_dir, "ca": ca}
    finally:
        admin.close()
        for stack in stacks:
            stack.close()
        store.close()


def make_token(cluster, **body) -> str:
    resp = cluster["admin"].post("/api/ai/join-tokens", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()["token"]


def dead_url() -> str:
    return f"https://127.0.0.1:{free_port()}"  # nothing listens there


def test_join_renew_and_heartbeat_through_failover(cluster, tmp_path):
    token = make_token(cluster, node_id="gpu-9", hosts=["10.0.0.9"], ttl_s=600)
    # The store keeps only the secret's hash.
    _id, secret, ca_hash = join_tokens.parse_token(token)
    stored = [kv.value for kv in cluster["store"].list(join_tokens.PREFIX)]
    assert len(stored) == 1 and secret not in stored[0]
    assert hashlib.sha256(secret.encode()).hexdigest() in stored[0]
    assert ca_hash == join_tokens.ca_sha256(cluster["dir"])
    listed = cluster["admin"].get("/api/ai/join-tokens").json()
    assert [t["node_id"] for t in listed] == ["gpu-9"] and "secret" not in str(listed)

    pki = tmp_path / "agent-pki"
    files = join(token, "gpu-9", [dead_url(), *cluster["urls"]], pki)
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert cert.subject.rfc4514_string() == "OU=fabric-node,CN=gpu-9"  # role node (common.pki)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpu-9" in sans.get_values_for_type(x509.DNSName)
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.9"]
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert not (cluster["dir"] / "pki/gpu-9.key").exists()  # the key was made on the node only
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= join_tokens.JOINED_CERT_DAYS
    with pytest.raises(JoinFailed, match="invalid, used or expired"):
        join(token, "gpu-9", cluster["urls"], tmp_path / "again")  # one time only

    # Register and heartbeat with it over mutual TLS; the first fabricd then goes away.
    ctx = client_ssl_context(files.ca, files.cert, files.key)
    client = FailoverClient([*cluster["urls"], dead_url()], verify=ctx)
    state = AgentState(node_id="gpu-9", vm_driver=DryRunDriver(tmp_path / "dry"),
                       inventory=NvmlInventory(nvml_module=FakeNvml(gpus=[])))
    beat = Heartbeat(state, client, "https://10.0.0.9:7443", resources=lambda: HostResources(4, 8.0))
    assert beat.beat()["id"] == "gpu-9" and client.base_url == cluster["urls"][0]
    cluster["stacks"][0].close()  # fabricd #1 stops
    assert beat.beat()["online"] is True
    assert client.base_url == cluster["urls"][1]  # failed over to fabricd #2
    client.close()

    # Renewal: not due yet; forced, a new key and certificate with the same SANs, via fabricd #2.
    old_key = files.key.read_bytes()
    assert renew("gpu-9", cluster["urls"], pki) is False
    assert renew("gpu-9", cluster["urls"], pki, force=True) is True
    renewed = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert renewed.serial_number != cert.serial_number and files.key.read_bytes() != old_key
    assert renewed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value == sans
    assert not renewal_due(files.cert)
    assert renewal_due(files.cert, now=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=61))


def test_tokens_refuse_the_wrong_node_a_wrong_ca_and_expiry(cluster, tmp_path):
    bound = make_token(cluster, node_id="gpu-1")
    with pytest.raises(JoinFailed, match="invalid, used or expired"):
        join(bound, "gpu-2", cluster["urls"], tmp_path / "p2")
    # a token naming another CA: the download is refused before anything is sent
    forged = bound.rsplit(".", 1)[0] + "." + "0" * 64
    with pytest.raises(JoinFailed, match="not the one the token names"):
        join(forged, "gpu-1", cluster["urls"], tmp_path / "p3")
    assert join(bound, "gpu-1", cluster["urls"], tmp_path / "p1").cert.exists()  # still unused: it works
    short, _record = join_tokens.create(cluster["store"], cluster["dir"], node_id=None, hosts=[], ttl_s=60, now=1000.0)
    with pytest.raises(Unauthorized):
        join_tokens.consume(cluster["store"], short, "gpu-3", now=1061.0)
    bad = cluster["admin"].post("/api/ai/join-tokens", json={"ttl_s": 10})
    assert bad.status_code == 422 and "ttl" in bad.text
    reserved = cluster["admin"].post("/api/ai/join-tokens", json={"node_id": "fabricd"})
    assert reserved.status_code == 422 and "reserved" in reserved.text


def test_join_and_renew_need_their_credentials(cluster, tmp_path):
    url = cluster["urls"][0]
    with httpx.Client(base_url=url, verify=client_ssl_context(cluster["ca"]), timeout=10) as anon:
        assert anon.post("/api/ai/join-tokens", json={}).status_code == 401  # admins only
        refused = anon.post("/api/ai/join", json={"token": "fjt1.a.b.c", "node_id": "gpu-5", "csr_pem": "x"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "bad_join_token"
        assert anon.post("/api/ai/nodes/gpu-5/renew", json={"csr_pem": "x"}).status_code == 401
        assert anon.get("/api/ai/join/ca").text == cluster["ca"].read_text()
    # A node's certificate renews only itself.
    files = join(make_token(cluster), "gpu-6", cluster["urls"], tmp_path / "p6")
    ctx = client_ssl_context(files.ca, files.cert, files.key)
    with httpx.Client(base_url=url, verify=ctx, timeout=10) as node:
        assert node.post("/api/ai/nodes/gpu-7/renew", json={"csr_pem": "x"}).status_code == 403


def test_control_plane_urls_split_and_failover_on_503(tmp_path):
    assert split_urls(["https://a:1/", "https://b:2,https://a:1", " https://c:3 "]) == [
        "https://a:1", "https://b:2", "https://c:3"]
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        return httpx.Response(503 if request.url.host == "a" else 200, json={"host": request.url.host})

    client = FailoverClient(["https://a", "https://b"], verify=True, transport=httpx.MockTransport(handler))
    assert client.post("/x").json() == {"host": "b"} and client.base_url == "https://b"
    assert client.post("/x").json() == {"host": "b"} and calls == ["a", "b", "b"]  # sticks to the one that works
    only = FailoverClient(["https://a"], verify=True, transport=httpx.MockTransport(handler))
    assert only.post("/x").status_code == 503  # the last answer, when every fabricd refuses
    assert node_files(Path("/p"), "n").cert == Path("/p/n.crt")


def test_fabricctl_join_token_then_fabric_agent_join_from_the_command_lines(cluster, tmp_path):
    import os
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "FABRIC_URL": cluster["urls"][0], "FABRIC_CA": str(cluster["ca"]),
           "FABRIC_TOKEN": cluster["admin"].headers["Authorization"].removeprefix("Bearer "),
           "HOME": str(tmp_path)}
    made = subprocess.run([str(bin_dir / "fabricctl"), "ai", "node", "join-token", "--node-id", "gpu-4", "--ttl", "120"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("fjt1.") and "fabric-agent join --node-id gpu-4" in made.stderr
    joined = subprocess.run([str(bin_dir / "fabric-agent"), "join", "--node-id", "gpu-4", "--pki-dir",
                             str(tmp_path / "pki"), "--control-plane", ",".join(cluster["urls"])],
                            capture_output=True, text=True, timeout=60, env={**env, "FABRIC_JOIN_TOKEN": token})
    assert joined.returncode == 0, joined.stderr
    assert (tmp_path / "pki/gpu-4.crt").exists() and token not in joined.stdout + joined.stderr
    check = subprocess.run([str(bin_dir / "fabric-agent"), "renew-cert", "--check", "--node-id", "gpu-4",
                            "--pki-dir", str(tmp_path / "pki"), "--control-plane", cluster["urls"][1]],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "not due" in check.stdout  # the timer's ExecCondition skips
