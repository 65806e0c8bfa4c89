"""Operational rules through a real gateway in front of real engines: shedding on any replica's
fresh queue reading, routing inside allowed sites and residency, batches checked on the models
in their input file, and an audit chain compared with its stored tips (a cut tail is found)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import openai
import pytest

from common import audit_chain, keyspace
from common.records import usage_docs
from common.schemas import EndpointStatus, InferenceEndpoint, Node, Replica, ReplicaObservation, Site
from lab.rigs.polling import wait_for
from lab.rigs.routing_plans import publish_plans
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "ops")
    eu, us = sim_engine("--replica-id", "eu-rep"), sim_engine("--replica-id", "us-rep")
    publish_endpoint(store, "shed2", [eu, us])
    publish_endpoint(store, "batchy", [eu])
    # "zoned": residency through the site records (eu is in europe, us in usa); "local": site_local
    # with eu preferred and room there (us is its failover site but takes nothing yet)
    store.put(keyspace.sites("eu"), Site(name="eu", residency="europe", failover_sites=["us"]).model_dump_json())
    store.put(keyspace.sites("us"), Site(name="us", residency="usa").model_dump_json())
    for name, extra in (("sited", {"allowed_sites": ["eu"]}), ("resident", {"residency": "eu"}),
                        ("zoned", {"residency": "europe"}),
                        ("local", {"routing": "site_local", "preferred_site": "eu", "routing_l7": "round_robin"})):
        ep = InferenceEndpoint(name=name, deployment=f"{name}-dep", status=EndpointStatus(phase="Ready"), **extra)
        store.put(keyspace.endpoints(name), ep.model_dump_json())
        for i, (engine, node) in enumerate(((eu, "node-eu"), (us, "node-us"), (us, "node-gone"))):
            rep = Replica(replica_id=f"{name}-{i}", deployment=f"{name}-dep", ordinal=i, node=node, host=engine.host,
                          port=engine.port, phase="Ready", ready=True)
            store.put(keyspace.replicas(f"{name}-dep", rep.replica_id), rep.model_dump_json())
    for node, site in (("node-eu", "eu"), ("node-us", "us")):
        store.put(keyspace.nodes(node), Node(id=node, address="https://127.0.0.1:1", site=site).model_dump_json())
    publish_plans(store)  # the routing controller's plan: what the gateway routes on
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2", "FABRIC_SHED_QUEUE": "2"})
    yield {"store": store, "gw": gw, "state": state, "url": url}
    gw.stop()
    eu.stop()
    us.stop()
    store.close()


def post(env, endpoint: str, key: str, session: str) -> httpx.Response:
    return httpx.post(env["gw"].openai_base(endpoint) + "/chat/completions", timeout=15,
                      headers={"authorization": f"Bearer {key}", "x-session-id": session},
                      json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})


def observe(store, replica_id: str, depth: float, age: float = 0) -> None:
    obs = ReplicaObservation(replica_id=replica_id, scraped_at=time.time() - age, ok=True, queue_depth=depth)
    store.put(keyspace.observations(replica_id), obs.model_dump_json())


def test_shed_when_any_replica_is_over_with_a_fresh_reading(env):
    store = env["store"]
    _, key = make_key(store, "shed2")
    observe(store, "shed2-dep-0", 5)  # one replica over FABRIC_SHED_QUEUE=2, the other idle
    observe(store, "shed2-dep-1", 0)
    time.sleep(0.3)
    r = post(env, "shed2", key, "s")
    assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded"
    observe(store, "shed2-dep-0", 5, age=31)  # a reading that old says nothing about the queue now
    time.sleep(0.3)
    assert post(env, "shed2", key, "s").status_code == 200


@pytest.mark.parametrize("endpoint", ["sited", "resident", "zoned", "local"])
def test_routing_stays_inside_allowed_sites_and_residency(env, endpoint):
    _, key = make_key(env["store"], endpoint)
    seen = set()
    for i in range(16):  # sessions spread over every eligible replica
        r = post(env, endpoint, key, f"session-{i}")
        assert r.status_code == 200
        seen.add(r.headers["x-fabric-replica"])
    assert seen == {"eu-rep"}


def test_calls_land_in_the_usage_ledger_per_tenant_and_key(env):
    store = env["store"]
    key_id, key = make_key(store, "sited", tenant="acme")
    r = post(env, "sited", key, "finops")
    assert r.status_code == 200
    usage = r.json()["usage"]
    rows = wait_for(lambda: [row for doc in usage_docs.docs(store) for row in doc.rows if row.key == key_id],
                    10, "the key's usage row", interval=0.05)  # the gateway writes its ledger every second
    assert [(r.tenant, r.endpoint, r.model, r.status, r.calls) for r in rows] == [("acme", "sited", "sim-m", "success", 1)]
    assert (rows[0].input_tokens, rows[0].output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])


def test_model_scoped_key_batches_are_checked_on_their_input_file(env):
    _, key = make_key(env["store"], "batchy", model="sim-m")
    c = openai.OpenAI(base_url=env["gw"].openai_base("batchy"), api_key=key, max_retries=0, timeout=15)

    def upload(model: str) -> str:
        rows = [{"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": model if i == 2 else "sim-m", "messages": [{"role": "user", "content": "q"}],
                          "max_tokens": 1}} for i in range(4)]
        return c.files.create(file=("b.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in rows)),
                              purpose="batch").id

    with pytest.raises(openai.PermissionDeniedError) as other:
        c.batches.create(input_file_id=upload("another-model"), endpoint="/v1/chat/completions",
                         completion_window="24h")
    assert "line 3" in other.value.message
    ok = c.batches.create(input_file_id=upload("sim-m"), endpoint="/v1/chat/completions", completion_window="24h")
    assert ok.id
    with pytest.raises(openai.PermissionDeniedError):  # a listing would show other models' files
        c.files.list()
    with pytest.raises(openai.PermissionDeniedError):
        c.batches.list()


def verify_cli(env, tip_file) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli", "verify-audit", "--state-dir", str(env["state"]),
                           "--store", env["url"], "--tip-file", str(tip_file)], capture_output=True, text=True,
                          timeout=60)


def test_verify_audit_finds_a_truncated_tail(env, tmp_path):
    store = env["store"]
    _, key = make_key(store, "shed2")
    store.delete(keyspace.observations("shed2-dep-0"))
    time.sleep(0.3)
    for i in range(3):
        assert post(env, "shed2", key, f"a{i}").status_code == 200
    time.sleep(0.5)  # the audit writer drains its queue
    tip_file = tmp_path / "audit-tip.json"
    first = verify_cli(env, tip_file)
    assert first.returncode == 0, first.stdout + first.stderr
    assert json.loads(tip_file.read_text())["seq"] == audit_chain.verify(store).rows
    # Cut the tail (the last entry: the writer's last batch of rows): the store's tip hint and
    # the tip kept outside the store both notice.
    entries = [kv.key for kv in store.list(keyspace.audit()) if not kv.key.endswith("/tip")]
    store.delete(entries[-1])
    assert audit_chain.verify(store).ok is False
    cut = verify_cli(env, tip_file)
    assert cut.returncode == 1 and "removed" in json.loads(cut.stdout)["reason"]
    # Even with the store's hint rewritten to match, the stored tip outside the store does not.
    store.put(keyspace.audit("tip"), str(audit_chain.read_rows(store)[-1]["seq"]))
    again = verify_cli(env, tip_file)
    assert again.returncode == 1 and "removed" in json.loads(again.stdout)["reason"]
