"""A restarted fabricd reloads replica identity from the store and carries on.

Real fabricd (controllers on, 1 s periods, a 3 s leader lease) and a real fabric-agent with the
dry-run driver (each replica a real fabric-engine-sim process). Two replicas become Ready;
fabricd is SIGKILLed (no clean shutdown: its lease is left to expire) and started again on the
same state directory. The same replicas stay Ready on the same engines, nothing is created
twice (replica records, GPU reservations, agent VMs, the VIP), and a scale to 3 adds ordinal 2.
"""

from __future__ import annotations

import re

import httpx
import pytest

from lab.rigs.polling import wait_for
from tests.integration.orchestration_harness import deploy, start_cluster

pytestmark = pytest.mark.e2e

DEP, EP = "llm", "llm-openai"


def replicas(api) -> list[dict]:
    return api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"]


def ready(api) -> dict[str, dict]:
    return {r["replica_id"]: r for r in replicas(api) if r["ready"]}


def allocations(api) -> dict[str, list[str]]:
    """replica id -> the GPUs reserved for it, from the reservations fabricd reports."""
    out: dict[str, list[str]] = {}
    for g in api.get("/api/ai/gpus").json():
        if g["allocated_to"]:
            out.setdefault(g["allocated_to"], []).append(g["pci"])
    return out


def agent_vms(api) -> list[str]:
    address = api.get("/api/ai/nodes/node-a").json()["address"]  # plain HTTP on loopback (lab mode)
    return sorted(vm["id"] for vm in httpx.get(f"{address}/v1/vms", timeout=10).json()["vms"])


def reconcile_passes(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(r'^fabric_controller_ticks_total\{controller="reconcile",outcome="ok"\} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_a_restarted_fabricd_keeps_its_replicas_and_continues(tmp_path):
    with start_cluster(tmp_path, gpus=4, env={"FABRIC_LEADER_TTL_SECS": "3",
                                              "FABRIC_ADDRESS_POOL": "10.96.0.20-10.96.0.21"}) as cluster:
        try:
            run(cluster)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{cluster.tail()}") from None


def run(cluster):
    with cluster.api() as api:
        deploy(api, DEP, EP, 2)

        wait_for(lambda: len(ready(api)) == 2, 90, "2 ready replicas")
        vip = wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip"), 30, "the VIP")
        before = ready(api)
        engines = {rid: (r["host"], r["port"]) for rid, r in before.items()}
        held = allocations(api)
        assert set(held) == set(before) and all(len(g) == 1 for g in held.values())
        assert agent_vms(api) == sorted(before)

    cluster.kill_fabricd()
    cluster.start_fabricd()

    with cluster.api() as api:  # the token secret lives in the store: the old token still works
        # The old lease must expire before the new process leads; then let it reconcile a few times.
        wait_for(lambda: reconcile_passes(cluster.url) >= 3, 60, "the restarted fabricd to reconcile")
        rows = replicas(api)
        assert sorted(r["replica_id"] for r in rows) == sorted(before)  # same identities, no duplicates
        assert all(r["ready"] and r["phase"] == "Ready" for r in rows)
        assert {r["replica_id"]: (r["host"], r["port"]) for r in rows} == engines  # same engines, adopted
        assert sorted(r["ordinal"] for r in rows) == [0, 1]
        assert allocations(api) == held  # no GPU reserved twice or again
        assert api.get("/api/ai/capacity").json()["gpus_free"] == 2
        assert agent_vms(api) == sorted(before)
        assert api.get(f"/api/ai/endpoints/{EP}").json()["status"]["vip"] == vip
        assert [v["vip"] for v in api.get("/api/ai/capacity").json()["vips"]] == [vip]
        dep = api.get(f"/api/ai/deployments/{DEP}").json()["status"]
        assert dep["phase"] == "Ready" and dep["ready_replicas"] == 2

        # It continues: a scale to 3 adds the first unused ordinal and keeps the two it had.
        assert api.post(f"/api/ai/deployments/{DEP}/scale", json={"replicas": 3}).status_code == 200
        wait_for(lambda: len(ready(api)) == 3, 90, "3 ready replicas")
        after = ready(api)
        assert set(before) < set(after)
        [new] = [r for rid, r in after.items() if rid not in before]
        assert new["ordinal"] == 2 and new["replica_id"].startswith(f"{DEP}-2-")
        alloc = allocations(api)
        assert set(alloc) == set(after) and len({g for gs in alloc.values() for g in gs}) == 3
        assert agent_vms(api) == sorted(after)
