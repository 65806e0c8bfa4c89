"""Orchestration end to end: real fabricd (controllers on, 1 s periods) and a real fabric-agent
with the dry-run driver, so every replica is a real fabric-engine-sim process on loopback whose
/health and /metrics the controllers really probe and scrape.

Story: deploy 3 replicas -> all Ready on distinct GPUs and an endpoint with a VIP; load applied
to one engine lowers its weight; an engine whose /health fails three times is replaced by a
new replica; drain then delete releases every GPU and the VIP."""

from __future__ import annotations

import httpx
import pytest

from lab.rigs.polling import wait_for
from tests.integration.orchestration_harness import deploy, start_cluster

# full (scripts/test-full; 35 s): make test keeps the same story on the lab (tests/e2e/test_lab_story.py,
# test_lab_no_drop.py: deploy, weights, health failure, drain, delete); docs/reliability.md
pytestmark = [pytest.mark.e2e, pytest.mark.full]

DEP, EP = "qwen", "qwen-openai"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("orch")
    with start_cluster(tmp, gpus=4, env={"FABRIC_ADDRESS_POOL": "10.96.0.7"}) as c:
        yield c


def routing(api) -> dict:
    return api.get(f"/api/ai/explain/routing/{EP}").json()


def ready_replicas(api) -> list[dict]:
    return [r for r in api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"] if r["ready"]]


def test_deploy_route_replace_drain_delete(cluster):
    with cluster.api() as api, httpx.Client(timeout=5) as plain:
        deploy(api, DEP, EP, 3, routing="least_queue")

        # 1. Three replicas become Ready on three distinct GPUs; the endpoint gets the first VIP.
        try:
            wait_for(lambda: len(ready_replicas(api)) == 3, 90, "3 ready replicas")
        except AssertionError:
            raise AssertionError(cluster.tail()) from None
        dep = api.get(f"/api/ai/deployments/{DEP}").json()
        assert dep["status"]["ready_replicas"] == 3 and "3/3 replicas ready" in dep["status"]["message"]
        explain = api.get(f"/api/ai/explain/placement/{DEP}").json()
        assert sorted(r["ordinal"] for r in explain["replicas"]) == [0, 1, 2]
        assert len({g for r in explain["replicas"] for g in r["gpus"]}) == 3
        cap = api.get("/api/ai/capacity").json()
        assert (cap["gpus_total"], cap["gpus_free"]) == (4, 1)
        # CPU and memory: the agent's --cpus/--memory-gib less the three 1-CPU, 1-GiB replicas.
        assert {k: cap["nodes"][0][k] for k in ("replicas", "cpu_allocatable", "cpu_committed", "cpu_free",
                                                "memory_committed_gib", "memory_free_gib")} == {
            "replicas": 3, "cpu_allocatable": 64, "cpu_committed": 3, "cpu_free": 61,
            "memory_committed_gib": 3, "memory_free_gib": 253}
        assert explain["node"] == "node-a", explain  # a fourth replica would still fit (1 GPU, 61 CPUs)
        wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip") == "10.96.0.7", 30,
                 "endpoint VIP")

        # 2. Weights follow load: queue 20 on one engine lowers its weight below the others.
        wait_for(lambda: sum(r["included"] for r in routing(api)["replicas"]) == 3, 30, "3 routed replicas")
        loaded = routing(api)["replicas"][0]
        base = f"http://{loaded['host']}:{loaded['port']}"
        assert plain.post(f"{base}/sim/load", json={"waiting": 20}).status_code == 200

        def loaded_weight_dropped():
            rows = {r["replica_id"]: r for r in routing(api)["replicas"]}
            mine = rows[loaded["replica_id"]]
            others = [r["weight"] for k, r in rows.items() if k != loaded["replica_id"]]
            return mine["metrics"].get("queue_depth") == 20 and mine["weight"] < min(others) and mine
        row = wait_for(loaded_weight_dropped, 30, "the loaded replica's weight to drop")
        assert row["weight"] == 2 and "least_queue" in row["reason"]
        assert plain.post(f"{base}/sim/load", json={"waiting": 0}).status_code == 200

        # 3. Health failing three times replaces the replica (new id, same ordinal freed).
        sick = loaded["replica_id"]
        assert plain.post(f"{base}/sim/faults", json={"fail_health": True}).status_code == 200

        def replaced():
            ids = {r["replica_id"] for r in ready_replicas(api)}
            return sick not in ids and len(ids) == 3 and ids
        wait_for(replaced, 60, "the unhealthy replica to be replaced")
        with pytest.raises(httpx.TransportError):
            plain.get(f"{base}/health")  # its engine process was stopped with the VM
        assert api.get("/api/ai/capacity").json()["gpus_free"] == 1

        # 4. Drain (weight 0 from the routing pass it brings forward, deleted after the grace)
        #    releases every GPU; explain shows the published plan, so the drain once it is pushed.
        r = api.post(f"/api/ai/deployments/{DEP}/drain", json={"grace_secs": 2})
        assert r.status_code == 202 and len(r.json()["drained"]) == 3
        wait_for(lambda: all(not x["included"] and x["reason"].startswith("draining")
                             for x in routing(api)["replicas"]), 15, "the drained replicas at weight 0 in the plan")
        wait_for(lambda: api.get("/api/ai/capacity").json()["gpus_free"] == 4, 60, "GPUs released")
        assert api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"] == []

        # 5. The one-address pool is exhausted for a second endpoint until deleting the first
        #    releases its VIP (no Maglev service anywhere: dry-run backends are gateway-only).
        assert api.post("/api/ai/endpoints", json={"name": "second", "deployment": DEP}).status_code == 201
        wait_for(lambda: "exhausted" in api.get("/api/ai/endpoints/second").json()["status"]["message"], 30,
                 "the second endpoint to wait for a VIP")
        assert api.get("/api/ai/capacity").json()["vips"] == [{"vip": "10.96.0.7", "endpoint": EP}]
        assert api.delete(f"/api/ai/endpoints/{EP}").status_code == 202  # Deleting until its VIP is released
        wait_for(lambda: api.get("/api/ai/endpoints/second").json()["status"].get("vip") == "10.96.0.7", 30,
                 "the released VIP to be reused")
        assert api.delete("/api/ai/endpoints/second").status_code == 202
        r = api.delete(f"/api/ai/deployments/{DEP}")
        assert r.status_code in (200, 202)
        wait_for(lambda: api.get(f"/api/ai/deployments/{DEP}").status_code == 404, 30, "deployment removal")


def test_missing_profile_reason_and_auth(cluster):
    with cluster.api() as api:
        assert api.get("/api/ai/explain/placement/nope").status_code == 404
        assert api.get("/api/ai/explain/routing/nope").json()["error"]["code"] == "not_found"
        bad = api.post("/api/ai/deployments/nope/drain", json={"grace_secs": -1})
        assert bad.status_code == 422
    with httpx.Client(base_url=cluster.url) as anon:
        assert anon.get("/api/ai/capacity").status_code == 401
