"""A real `fabric-gateway` process asks a real `fabric-agent` process for its KV index over mutual
TLS, as in a cluster: the agent demands a cluster-CA certificate and admits the gateway's CN
(``fabric-gateway``, its --kv-index-client-cn default) on /v1/kv-index/* only; the gateway
presents its FABRIC_GATEWAY_KV_CLIENT_* certificate and names the node as the TLS server name,
while it reaches the replica itself over plain HTTP (backend TLS off). The agent (dry-run
driver, engines simulated) watches no replica, so its answer is ``unwatched``, which the
explanation shows; a gateway whose CN the agent does not admit sees ``refused``. The gateway's
certificate is the one `fabricd pki issue-client` writes, as an operator installs it."""

from __future__ import annotations

import subprocess

import httpx
import pytest
from typer.testing import CliRunner

from common import keyspace
from common.pki import client_ssl_context, ensure_ca, issue_cert, pki_dir
from common.schemas import (
    EndpointStatus,
    InferenceDeployment,
    InferenceEndpoint,
    ModelArtifact,
    ModelStatus,
    Node,
    Replica,
)
from controlplane.cli_fabricd import app as fabricd_app
from lab.rigs.polling import wait_for
from lab.rigs.routing_plans import publish_plans
from lab.rigs.servers import free_port
from tests.gateway.gateway_harness import GatewayProcess, make_key, sim_engine, sqlite_state
from tests.integration.orchestration_harness import agent_command, clean_env

NODE = "node-kv"
DIGEST = "c" * 64
CHAT = {"model": "sim-m", "max_tokens": 1, "messages": [{"role": "system", "content": "Be brief. " * 80},
                                                     {"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "kvmtls")
    ensure_ca(state)
    issue_cert(state, NODE, server=True, client=True, role="node", hosts=["127.0.0.1"])
    issued = CliRunner().invoke(fabricd_app, ["pki", "issue-client", "--state-dir", str(state),
                                              "--out", str(state / "gw-kv")])
    assert issued.exit_code == 0, issued.output
    issue_cert(state, "intruder", server=False, client=True, role="node")
    pki = pki_dir(state)
    port = free_port()
    log = state / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            agent_command() + ["--node-id", NODE, "--listen", f"127.0.0.1:{port}", "--pki-dir", str(pki),
                               "--vm-driver", "dry-run", "--fake-gpus", "1", "--no-dataplane",
                               "--state-dir", str(state / "agent"), "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, env=clean_env({}))
    address = f"https://127.0.0.1:{port}"
    engine = sim_engine()
    try:
        _wait_for_agent(agent, address, pki, log)
        store.put(keyspace.nodes(NODE), Node(id=NODE, address=address).model_dump_json())
        store.put(keyspace.models("m"), ModelArtifact(name="m", source="hf://o/m", status=ModelStatus(
            phase="Ready", digest=DIGEST)).model_dump_json())
        store.put(keyspace.deployments("d"), InferenceDeployment(name="d", model="m", profile="p").model_dump_json())
        store.put(keyspace.endpoints("e"), InferenceEndpoint(name="e", deployment="d", routing_l7="prefix",
                                                             status=EndpointStatus(phase="Ready")).model_dump_json())
        store.put(keyspace.replicas("d", "d-0"), Replica(
            replica_id="d-0", deployment="d", ordinal=0, node=NODE, host=engine.host, port=engine.port,
            phase="Ready", ready=True).model_dump_json())
        publish_plans(store)  # the routing controller's plan: what the gateway routes on
        yield state, url, store, pki, address
    finally:
        engine.stop()
        agent.terminate()
        agent.wait(15)
        store.close()


def _issued(pki):
    """(dir, CN) of the files issue-client wrote: {dir}/fabric-gateway.crt, .key, ca.crt."""
    return pki.parent / "gw-kv", "fabric-gateway"


def _gateway_ctx(pki):
    d, cn = _issued(pki)
    return client_ssl_context(d / "ca.crt", d / f"{cn}.crt", d / f"{cn}.key")


def _wait_for_agent(proc, address, pki, log):
    ctx = _gateway_ctx(pki)
    def answers() -> bool:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            return httpx.get(address + "/v1/kv-index", verify=ctx, timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answers, 40, f"the agent's /v1/kv-index (log: {log})", interval=0.2)


def _gateway(state, url, pki, cn: str, gateway_id: str, extra: dict | None = None) -> GatewayProcess:
    d = _issued(pki)[0] if cn == "fabric-gateway" else pki
    env = {"FABRIC_GATEWAY_KV_CA": str(d / "ca.crt"), "FABRIC_GATEWAY_KV_CLIENT_CERT": str(d / f"{cn}.crt"),
           "FABRIC_GATEWAY_KV_CLIENT_KEY": str(d / f"{cn}.key"), **(extra or {})}
    return GatewayProcess.start(state, url, env=env, gateway_id=gateway_id)


def _explained(gw: GatewayProcess, store) -> dict:
    """The explanation of a call made once the gateway has its tokenizer and a connection to the
    agent: a call waits neither for the tokenizer's fetch nor more than 100 ms for the agent (a
    cold TLS connection on a busy machine may take longer), so the first ones may be approximate."""
    _, key = make_key(store, "e")
    auth = {"authorization": f"Bearer {key}"}
    def explained() -> dict | None:
        r = httpx.post(gw.openai_base("e") + "/chat/completions", json=CHAT, headers=auth, timeout=30)
        assert r.status_code == 200, r.text  # the replica over plain HTTP, the agent over mTLS
        rid = r.headers.get("x-fabric-request-id")
        why = httpx.get(f"{gw.url}/api/ai/explain/request/{rid}", headers=auth, timeout=10)
        assert why.status_code == 200, why.text
        settled = why.json()["kv_index"] == "precise" and "no_answer" not in why.json()["kv_states"].values()
        return why.json() if settled else None

    return wait_for(explained, 20, "a call explained with the precise index", interval=0.2)


def test_the_gateway_reads_the_agents_index_over_mtls(cluster):
    state, url, store, pki, address = cluster
    gw = _gateway(state, url, pki, "fabric-gateway", "gw-kv")
    try:
        why = _explained(gw, store)
        # The tokenizer came from the agent (a dry-run node answers "sim"), then its index answered.
        assert why["kv_index"] == "precise", (why, gw.log_text()[-2000:])
        assert why["kv_states"] == {"d-0": "unwatched"} and why["kv_blind"] == []
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        assert 'fabric_gateway_kv_blind_replicas{endpoint="e"} 0.0' in metrics
    finally:
        gw.stop()


def test_the_agent_admits_the_gateways_cn_on_the_kv_index_only(cluster):
    _, _, _, pki, address = cluster
    ctx = _gateway_ctx(pki)
    with httpx.Client(base_url=address, verify=ctx, timeout=10) as c:
        assert c.post("/v1/kv-index/match", json={"hashes": [1], "replicas": ["x"]}).json()["replicas"]["x"][
            "state"] == "unwatched"
        assert c.get(f"/v1/kv-index/tokenizer/{DIGEST}").json()["engine"] == "sim"
        for refused in (c.get("/v1/health"), c.get("/v1/vms"), c.get("/metrics")):
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "caller_not_allowed"


def test_a_gateway_the_agent_does_not_admit_sees_refused(cluster, tmp_path):
    state, url, store, pki, _ = cluster
    (tmp_path / "d.sim").write_text("")  # a tokenizer of its own, so it asks the index
    gw = _gateway(state, url, pki, "intruder", "gw-intruder", {"FABRIC_GATEWAY_KV_TOKENIZERS": str(tmp_path)})
    try:
        why = _explained(gw, store)
        assert why["kv_index"] == "precise" and why["kv_states"] == {"d-0": "refused"}
        assert why["blind_replicas"] == ["d-0"]  # scored by the approximate tree
    finally:
        gw.stop()
