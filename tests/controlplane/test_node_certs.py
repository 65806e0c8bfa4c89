"""Issue 50, node identity: each test performs an attack over real mutual TLS on loopback
(fabricd's real app on uvicorn with its peer-certificate protocol, SQLite store, the agent's own
join and renewal code) and shows it refused.

- an any-node join token cannot take an existing node's id, nor one a racing joiner took;
- reserved and address-like node ids are refused;
- the site and replica networks come from the token, not the node's first report;
- a certificate of another role (a gateway's, one without a role) is not a node, whatever its CN;
- a deleted node's certificates are revoked: no heartbeat, no renewal; a re-added node works;
- a node cannot renew in a loop.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from agent.api import caller_refusal
from agent.join import JoinFailed, join, renew
from common.peer_cert import CN_KEY, ROLE_KEY, TLS_EXT
from common.pki import client_ssl_context, issue_cert
from controlplane import node_certs
from tests.agent.test_node_join import cluster as join_cluster


@pytest.fixture
def cluster(tmp_path):
    """test_node_join's two fabricd over one store, first one's URL as "url"."""
    with contextmanager(join_cluster.__wrapped__)(tmp_path) as c:
        yield {**c, "url": c["urls"][0]}


def token(cluster, **body) -> str:
    r = cluster["admin"].post("/api/ai/join-tokens", json=body)
    assert r.status_code == 201, r.text
    assert "--token" not in r.json()["command"]  # the suggested command keeps the secret off argv
    return r.json()["token"]


def as_node(cluster, files) -> httpx.Client:
    return httpx.Client(base_url=cluster["url"], verify=client_ssl_context(files.ca, files.cert, files.key), timeout=10)


def report(node_id: str, site: str = "") -> dict:
    return {"id": node_id, "address": "https://127.0.0.1:9443", "site": site}


def test_an_any_node_token_cannot_take_an_existing_node(cluster, tmp_path):
    victim = join(token(cluster, node_id="gpu-1"), "gpu-1", [cluster["url"]], tmp_path / "victim")
    with as_node(cluster, victim) as c:
        assert c.post("/api/ai/nodes", json=report("gpu-1")).status_code == 201
    spare = token(cluster)  # made without --node-id
    with pytest.raises(JoinFailed, match="409.*only creates a new node"):
        join(spare, "gpu-1", [cluster["url"]], tmp_path / "thief")
    # the refusal came before the token was spent: it still makes a new node
    assert join(spare, "gpu-2", [cluster["url"]], tmp_path / "new").cert.exists()
    # two any-node joiners racing for one new id, before either registered: one certificate
    with pytest.raises(JoinFailed, match="409"):
        join(token(cluster), "gpu-2", [cluster["url"]], tmp_path / "second")


def test_reserved_and_address_like_node_ids_are_refused(cluster, tmp_path):
    spare = token(cluster)
    for name in ("localhost", "localhost-1", "fabric-gateway", "fabricd", "etcd", "2130706433", "0x7f000001"):
        assert cluster["admin"].post("/api/ai/join-tokens", json={"node_id": name}).status_code == 422
        with pytest.raises(JoinFailed, match="422"):
            join(spare, name, [cluster["url"]], tmp_path / "p")
        assert cluster["admin"].post(f"/api/ai/nodes/{name}/certificate", json={}).status_code in (409, 422)


def test_the_site_and_networks_come_from_the_token(cluster, tmp_path):
    files = join(token(cluster, site="eu-1", replica_networks=["10.8.0.0/16"]), "gpu-3", [cluster["url"]],
                 tmp_path / "p")
    with as_node(cluster, files) as c:
        lie = c.post("/api/ai/nodes", json=report("gpu-3", site="us-secure"))
        assert lie.status_code == 409 and lie.json()["error"]["code"] == "node_identity_fixed"
        assert c.post("/api/ai/nodes", json=report("gpu-3", site="eu-1")).status_code == 201
    node = cluster["admin"].get("/api/ai/nodes/gpu-3").json()
    assert node["site"] == "eu-1" and node["replica_networks"] == ["10.8.0.0/16"]


def test_a_certificate_of_another_role_is_no_node(cluster, tmp_path):
    pki = cluster["dir"]
    for role in ("gateway", None):  # a gateway's client certificate; a certificate with no role at all
        crt, key = issue_cert(pki, "gpu-4", server=False, client=True, role=role)
        with httpx.Client(base_url=cluster["url"], verify=client_ssl_context(cluster["ca"], crt, key)) as c:
            r = c.post("/api/ai/nodes", json=report("gpu-4"))
            assert r.status_code == 403 and r.json()["error"]["code"] == "not_a_node_certificate"
            assert c.post("/api/ai/nodes/gpu-4/renew", json={"csr_pem": "x"}).status_code == 403
    assert cluster["admin"].get("/api/ai/nodes/gpu-4").status_code == 404


def test_the_agent_admits_the_control_plane_and_gateways_by_role_too():
    def scope(cn, role, path="/v1/vms"):
        return {"scheme": "https", "path": path, "extensions": {TLS_EXT: {CN_KEY: cn, ROLE_KEY: role}}}

    assert caller_refusal(scope("fabricd", "fabricd"), {"fabricd"}) is None
    assert caller_refusal(scope("fabricd", "node"), {"fabricd"}) is not None  # a node's cert named fabricd
    assert caller_refusal(scope("fabricd", None), {"fabricd"}) is not None
    kv = "/v1/kv-index/match"
    assert caller_refusal(scope("fabric-gateway", "gateway", kv), {"fabricd"}, {"fabric-gateway"}) is None
    assert caller_refusal(scope("fabric-gateway", "node", kv), {"fabricd"}, {"fabric-gateway"}) is not None


def test_a_deleted_node_can_neither_heartbeat_nor_renew(cluster, tmp_path):
    files = join(token(cluster, node_id="gpu-5"), "gpu-5", [cluster["url"]], tmp_path / "p")
    stolen = tmp_path / "stolen"
    stolen.mkdir()
    for f in (files.cert, files.key, files.ca):
        (stolen / f.name).write_bytes(f.read_bytes())
    with as_node(cluster, files) as c:
        assert c.post("/api/ai/nodes", json=report("gpu-5")).status_code == 201
    assert cluster["admin"].delete("/api/ai/nodes/gpu-5").status_code == 204
    assert cluster["admin"].get("/api/ai/nodes/gpu-5").status_code == 404
    with as_node(cluster, files) as c:
        for r in (c.post("/api/ai/nodes", json=report("gpu-5")),
                  c.post("/api/ai/nodes/gpu-5/heartbeat", json=report("gpu-5"))):
            assert r.status_code == 403 and r.json()["error"]["code"] == "certificate_revoked"
    with pytest.raises(JoinFailed, match="403.*revoked"):
        renew("gpu-5", [cluster["url"]], stolen, force=True)
    # an any-node token may now create gpu-5 anew, with a new key; the old certificate stays dead
    time.sleep(1.05)  # revocation keeps whole seconds: a certificate signed in the delete's second is revoked too
    fresh = join(token(cluster), "gpu-5", [cluster["url"]], tmp_path / "fresh")
    with as_node(cluster, fresh) as c:
        assert c.post("/api/ai/nodes", json=report("gpu-5")).status_code == 201
    with httpx.Client(base_url=cluster["url"], verify=client_ssl_context(
            stolen / "ca.crt", stolen / "gpu-5.crt", stolen / "gpu-5.key")) as c:
        assert c.post("/api/ai/nodes/gpu-5/heartbeat", json=report("gpu-5")).status_code == 403


def test_a_node_cannot_renew_in_a_loop(cluster, tmp_path):
    files = join(token(cluster, node_id="gpu-6"), "gpu-6", [cluster["url"]], tmp_path / "p")
    renewed = 0
    with pytest.raises(JoinFailed, match="429"):
        for _ in range(node_certs.RENEWALS_PER_HOUR + 1):
            renew("gpu-6", [cluster["url"]], tmp_path / "p", force=True)
            renewed += 1
    assert renewed == node_certs.RENEWALS_PER_HOUR - 1  # the join counts as one signing
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())  # renewal kept the role
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "fabric-node"
    events = cluster["admin"].get("/api/ai/events", params={"limit": 100}).json()
    assert sum(1 for e in events if e.get("action") == "certificate-renewed") == renewed
