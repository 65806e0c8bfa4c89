"""MIG slices end to end: real fabricd (controllers on) and a real fabric-agent (dry-run driver,
fake H100s). Slices made with `fabricctl ai node mig-create` take replicas of a profile asking for
that MIG profile; a whole-GPU deployment never lands on the sliced parent; a held slice cannot be
deleted (`fabricctl ai node mig-delete` exits 1) until its replicas are gone."""

from __future__ import annotations

import subprocess

import pytest

from lab.rigs.polling import clean_env, wait_for
from tests.integration.orchestration_harness import BIN, start_cluster

# full (scripts/test-full; 16 s); make test covers it with the MIG planner and agent routes (tests/controlplane/placement/, tests/agent/)
pytestmark = [pytest.mark.e2e, pytest.mark.full]


def fabricctl(cluster, *args: str) -> subprocess.CompletedProcess:
    env = clean_env({"FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token})
    return subprocess.run([str(BIN / "fabricctl"), *args], capture_output=True, text=True, env=env, timeout=60,
                          check=False)


def test_replicas_run_on_slices_and_the_parent_stays_whole_gpu_free(tmp_path):
    with start_cluster(tmp_path, gpus=2, env={"FABRIC_DRAIN_GRACE_SECS": "1"}) as cluster, cluster.api() as api:
        gpus = sorted(g["pci"] for g in api.get("/api/ai/nodes/node-a").json()["gpus"])
        parent, other = gpus
        for _ in range(2):
            made = fabricctl(cluster, "ai", "node", "mig-create", "node-a", "--parent-bdf", parent, "--profile", "1g")
            assert made.returncode == 0, made.stderr
        slices = [s["id"] for s in api.get("/api/ai/nodes/node-a/mig").json()]
        assert slices == [f"{parent}--1g.10gb--0", f"{parent}--1g.10gb--1"]
        assert api.post("/api/ai/models", json={"name": "tiny", "source": "hf://Qwen/Qwen3-8B"}).status_code == 201
        for name, gpu in (("slice", {"count": 1, "vram_gib": 8, "mig_profile": "1g.10gb"}),
                          ("whole", {"count": 1, "vram_gib": 8})):
            assert api.post("/api/ai/profiles", json={"name": name, "gpu": gpu, "cpu": 1,
                                                      "memory_gib": 1}).status_code == 201
        for dep, prof, n in (("on-slices", "slice", 2), ("on-gpus", "whole", 2)):
            r = api.post("/api/ai/deployments", json={"name": dep, "model": "tiny", "profile": prof, "replicas": n})
            assert r.status_code == 201, r.text

        def ready(dep):
            return api.get(f"/api/ai/deployments/{dep}").json()["status"].get("ready_replicas")

        try:
            wait_for(lambda: ready("on-slices") == 2, 90, "2 replicas on MIG slices")
            wait_for(lambda: ready("on-gpus") == 1, 60, "1 whole-GPU replica")
        except AssertionError:
            states = {d: api.get(f"/api/ai/deployments/{d}").json()["status"] for d in ("on-slices", "on-gpus")}
            raise AssertionError(f"{states}\n{cluster.tail()[-3000:]}") from None
        node_cap = api.get("/api/ai/capacity").json()["nodes"][0]
        # The sliced GPU is not free for whole-GPU use; its two slices are both held.
        assert {k: node_cap[k] for k in ("gpus_total", "gpus_free", "mig_slices", "mig_slices_free")} == {
            "gpus_total": 2, "gpus_free": 0, "mig_slices": 2, "mig_slices_free": 0}
        placement = api.get("/api/ai/explain/placement/on-slices").json()
        assert sorted(g for r in placement["replicas"] for g in r["gpus"]) == slices
        whole = api.get("/api/ai/explain/placement/on-gpus").json()
        assert [g for r in whole["replicas"] for g in r["gpus"]] == [other]
        # The second whole-GPU replica has nowhere to go: the parent is sliced.
        assert ready("on-gpus") == 1
        assert "MIG" in whole["message"] or any("MIG" in n["reason"] for n in whole["nodes"]), whole
        held = fabricctl(cluster, "ai", "node", "mig-delete", "node-a", slices[0])
        assert held.returncode == 1 and "held by replica" in held.stderr
        assert api.post("/api/ai/deployments/on-slices/scale", json={"replicas": 0}).status_code == 200
        wait_for(lambda: fabricctl(cluster, "ai", "node", "mig-delete", "node-a", slices[0]).returncode == 0, 60,
                 "the slice to be deletable once its replica is gone")
        listed = fabricctl(cluster, "ai", "node", "mig-list", "node-a")
        assert slices[0] not in listed.stdout and slices[1] in listed.stdout
