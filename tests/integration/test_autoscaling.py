"""Autoscaling end to end: real fabricd (controllers on, 1 s periods), a real fabric-agent with the
dry-run driver (every replica a real fabric-engine-sim process), and a real fabric-gateway on the
same store.

Story: one replica with autoscaling 1-2 -> /sim/load queue 20 held -> scale out to 2 (event,
status message, explain) -> load removed -> scale in to 1, draining the idle replica -> scale to
zero (set with fabricctl) -> a call through the gateway with the official openai client as it
ships records demand and is held until the replica is Ready, then answered ->
deleting the deployment drains and removes everything."""

from __future__ import annotations

import os
import subprocess

import httpx
import openai
import pytest

from common.store.connect import open_store
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import HMAC_SECRET, GatewayProcess, make_key
from tests.integration.orchestration_harness import BIN, deploy, start_cluster

# full: scale out/in into the BPF map runs in make test as tests/e2e/test_lab_rollout.py::test_queue_scales_out_into_the_bpf_map_and_back_in, the wake-up's hold
# as tests/gateway/test_gateway_cold_start.py, the decisions as tests/controlplane/scaling/.
pytestmark = [pytest.mark.e2e, pytest.mark.full]

DEP, EP = "auto", "auto-openai"
SPEC = {"min_replicas": 1, "max_replicas": 2, "scale_out_queue": 5, "scale_out_seconds": 2, "scale_in_queue": 1,
        "scale_in_seconds": 3, "cooldown_seconds": 1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autoscale")
    # No dataplane here (dry-run agent), so the VIP carries nothing: a loopback VIP refuses at once
    # and the gateway falls through to the replica (an off-host one would go out the default route).
    env = {"FABRIC_AUTOSCALE_SECS": "1", "FABRIC_ADDRESS_POOL": "127.0.99.7", "FABRIC_KEY_HMAC_SECRET": HMAC_SECRET,
           "FABRIC_DRAIN_GRACE_SECS": "30"}
    with start_cluster(tmp, gpus=3, env=env) as c:
        yield c


def replicas(api) -> list[dict]:
    return api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"]


def ready(api) -> list[dict]:
    return [r for r in replicas(api) if r["ready"] and not r["draining"]]


def reasons(api, **params) -> list[str]:
    return [e["reason"] for e in api.get("/api/ai/events", params={"limit": 1000, **params}).json()]


def fabricctl(cluster, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token}
    return subprocess.run([str(BIN / "fabricctl"), *args], capture_output=True, text=True, env=env, check=True)


def test_scale_out_in_to_zero_and_back_through_the_gateway(cluster, tmp_path):
    with cluster.api() as api, httpx.Client(timeout=5) as plain:
        deploy(api, DEP, EP, 1)
        try:
            wait_for(lambda: len(ready(api)) == 1, 60, "1 ready replica")
        except AssertionError:
            raise AssertionError(cluster.tail()) from None
        assert api.put(f"/api/ai/deployments/{DEP}/autoscaling", json=SPEC).status_code == 200

        # 1. Queue 20 on the only replica, held past scale_out_seconds: scale out to 2.
        first = ready(api)[0]
        base = f"http://{first['host']}:{first['port']}"
        assert plain.post(f"{base}/sim/load", json={"waiting": 20}).status_code == 200
        try:
            wait_for(lambda: len(ready(api)) == 2, 60, "scale out to 2 ready replicas")
        except AssertionError:
            raise AssertionError(cluster.tail()) from None
        dep = api.get(f"/api/ai/deployments/{DEP}").json()
        assert dep["replicas"] == 2
        assert "ScaledOut" in reasons(api, object=f"deployment/{DEP}")
        assert 'fabric_autoscaler_decisions_total{action="scale_out",code="queue_high"} 1.0' in \
            api.get("/metrics").text
        explain = api.get(f"/api/ai/explain/scaling/{DEP}").json()
        assert explain["signal"]["ready"] == 2 and explain["conditions"]["scale_out_queue"]["threshold"] == 5
        # At max_replicas with the queue still high, the autoscaler holds and says so.
        wait_for(lambda: "already at max_replicas 2" in api.get(f"/api/ai/deployments/{DEP}").json()["status"]
                 ["message"], 30, "the at-max hold on the status message")

        # 2. Load removed: the mean queue stays under 1 for 3 s -> scale in to 1 by draining.
        assert plain.post(f"{base}/sim/load", json={"waiting": 0}).status_code == 200
        wait_for(lambda: len(replicas(api)) == 1, 60, "scale in to 1 replica")
        assert api.get(f"/api/ai/deployments/{DEP}").json()["replicas"] == 1
        assert "ScaledIn" in reasons(api, object=f"deployment/{DEP}")
        drained = [e for e in api.get("/api/ai/events", params={"kind": "replica", "limit": 1000}).json()
                   if e["reason"] == "ReplicaDeleted"]
        assert drained and "drained: no requests running or waiting" in drained[-1]["message"]
        gone = drained[-1]["name"]
        history = api.get(f"/api/ai/explain/failure/{gone}").json()
        assert [e["reason"] for e in history["history"]][:1] == ["ReplicaCreated"]
        assert "DrainStarted" in [e["reason"] for e in history["history"]] and history["current"] is None

        # 3. Scale to zero, set with fabricctl (only the flags given change).
        fabricctl(cluster, "ai", "deployment", "autoscale", DEP, "--scale-to-zero", "--scale-in-seconds", "4",
                  "--scale-to-zero-idle-seconds", "4")
        spec = api.get(f"/api/ai/deployments/{DEP}").json()["autoscaling"]
        assert spec["scale_to_zero"] is True and spec["max_replicas"] == 2 and spec["scale_in_seconds"] == 4
        wait_for(lambda: not replicas(api), 90, "scale to zero")
        assert api.get(f"/api/ai/deployments/{DEP}").json()["replicas"] == 0

        # 4. A call through the gateway wakes it and is held (the default) until the replica is Ready:
        # the official openai client as it ships (its own 2 retries, 600 s timeout) gets the answer.
        store = open_store(f"sqlite://{cluster.state_dir}/fabric.db")
        gw = GatewayProcess.start(tmp_path, f"sqlite://{cluster.state_dir}/fabric.db")
        try:
            _, key = make_key(store, EP)
            client = openai.OpenAI(base_url=gw.openai_base(EP), api_key=key)
            raw = client.chat.completions.with_raw_response.create(
                model=DEP, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            assert raw.http_response.status_code == 200 and raw.retries_taken == 0
            assert raw.parse().choices[0].message.content
        finally:
            gw.stop()
            store.close()
        assert "ScaledOut" in reasons(api, object=f"deployment/{DEP}", since="2m")
        assert api.get(f"/api/ai/deployments/{DEP}").json()["replicas"] == 1

        # 5. Deleting the deployment drains its replica, then removes the record.
        assert api.delete(f"/api/ai/endpoints/{EP}").status_code == 202  # Deleting: its VIP drains first
        assert api.delete(f"/api/ai/deployments/{DEP}").status_code in (200, 202)
        wait_for(lambda: api.get(f"/api/ai/deployments/{DEP}").status_code == 404, 60, "deployment removal")
        assert api.get("/api/ai/capacity").json()["gpus_free"] == 3
        assert "Deleted" in reasons(api, object=f"deployment/{DEP}")
