"""The model supply chain end to end: real fabricd, a real fabric-agent (dry-run VMs), a loopback
HF mirror and the real huggingface_hub client on the agent.

A deployment of a model that is not on the node waits (replica Pending, the job's progress as
its message, no VM) until the job is Ready; fabricd is SIGKILLed mid-download and the restarted
one carries the job on; every state is in the stored job's history; verify, eviction (keeping
the model a deployment names), re-materialize, a gated repository and fabricctl --wait."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.models.checks import build_manifest
from lab.hf_mirror import commit_of
from lab.rigs.polling import clean_env, wait_for
from lab.tiny_model import write_tiny_model
from tests.integration.orchestration_harness import start_cluster

pytestmark = pytest.mark.e2e
EVERY_STATE = ["Registered", "Resolving", "Downloading", "Verifying", "Scanning", "Ready"]


def status(api, name: str) -> dict:
    r = api.get(f"/api/ai/models/{name}/status")
    assert r.status_code == 200, r.text
    return r.json()


def finished(api, name: str, timeout: float = 60) -> dict:
    return wait_for(lambda: (s := status(api, name))["state"] in ("Ready", "Failed") and s, timeout,
                    f"model {name} to finish")


def test_replicas_wait_for_the_model_and_the_cache_is_managed(tmp_path):
    with start_cluster(tmp_path) as cluster:
        root = cluster.mirror.cfg.root
        slow = write_tiny_model(root / "fab" / "slow", extra_bytes=24_000_000, seed=1)
        write_tiny_model(root / "fab" / "small", seed=2)
        write_tiny_model(root / "fab" / "gated", seed=3)
        cluster.mirror.cfg.gated["fab/gated"] = "hf_only_the_mirror_knows"
        cluster.mirror.cfg.rate = 3_000_000  # ~8 s for the big shard
        with cluster.api() as api:
            assert api.post("/api/ai/models", json={"name": "slow", "source": "hf://fab/slow"}).status_code == 201
            assert status(api, "slow")["state"] == "Registered"
            assert api.post("/api/ai/profiles", json={"name": "g1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1,
                                                      "memory_gib": 1}).status_code == 201
            r = api.post("/api/ai/deployments", json={"name": "chat", "model": "slow", "profile": "g1", "replicas": 1})
            assert r.status_code == 201, r.text

            def waiting_replica():
                reps = api.get("/api/ai/deployments/chat/metrics").json()["replicas"]
                return reps and reps[0]["phase"] == "Pending" and reps[0]["host"] is None and reps[0]
            wait_for(waiting_replica, 30, "a Pending replica")
            downloading = wait_for(lambda: (s := status(api, "slow"))["state"] == "Downloading"
                                   and s["bytes_done"] > 0 and s, 30, "the download to progress")
            assert 0 < downloading["bytes_done"] < downloading["bytes_total"]
            wait_for(lambda: "model slow: Downloading" in api.get("/api/ai/deployments/chat").json()["status"]["message"],
                     10, "the deployment to show the download")
            rep = api.get("/api/ai/deployments/chat/metrics").json()["replicas"][0]
            assert rep["phase"] == "Pending"
            assert not [v for v in api.get("/api/ai/deployments/chat/metrics").json()["replicas"] if v["host"]]

            cluster.kill_fabricd()  # mid-download: the agent keeps fetching, the new fabricd follows
            cluster.start_fabricd()
        with cluster.api() as api:
            done = finished(api, "slow", 90)
            assert done["state"] == "Ready", done
            assert done["digest"] == build_manifest(slow).digest
            assert done["revision"] == commit_of(slow)
            jobs = api.get("/api/ai/model-jobs").json()
            job = next(j for j in jobs if j["model"] == "slow")
            assert [h["state"] for h in job["history"]] == EVERY_STATE
            wait_for(lambda: api.get("/api/ai/deployments/chat").json()["status"]["ready_replicas"] == 1, 60,
                     "the replica to start once the model is Ready")
            wait_for(lambda: status(api, "slow")["nodes"][0]["cached"], 15, "the heartbeat to report the digest")

            metrics = api.get("/metrics").text
            assert 'fabric_model_jobs{state="Ready"} 1.0' in metrics
            verified = api.post("/api/ai/models/slow/verify").json()
            assert [r["ok"] for r in verified["results"]] == [True]

            # A second model, not deployed: materialize, then evict down to nothing.
            assert api.post("/api/ai/models", json={"name": "small", "source": "hf://fab/small"}).status_code == 201
            r = api.post("/api/ai/models/small/materialize", json={})
            assert r.status_code == 202 and r.json()["jobs"][0]["node"] == "node-a"
            assert finished(api, "small")["state"] == "Ready"
            ev = api.post("/api/ai/models/cache/evict", json={"budget_bytes": 0}).json()
            small_digest = status(api, "small")["digest"]
            assert [e["digest"] for e in ev["evicted"]] == [small_digest]
            kept = {e["digest"]: e["reason"] for e in ev["kept"]}
            assert "model slow is named by a deployment" in kept[done["digest"]]
            assert ev["over_budget"]["node-a"] > 0  # what a deployment uses stays, even over budget
            assert api.get("/api/ai/models/small").status_code == 200  # the record remains
            assert status(api, "small")["nodes"] == []
            agent_cache = tmp_path / "agent" / "models" / "by-digest"
            assert sorted(p.name for p in agent_cache.iterdir()) == [done["digest"]]
            assert api.post("/api/ai/models/cache/evict", json={}).status_code == 422  # no budget anywhere

            # Materialize again with fabricctl, following the job to Ready.
            env = clean_env({"FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token})
            ctl = Path(sys.executable).parent / "fabricctl"
            res = subprocess.run([str(ctl), "ai", "model", "materialize", "small", "--wait"], capture_output=True,
                                 text=True, env=env, timeout=120)
            assert res.returncode == 0, res.stderr
            assert f"model small Ready: digest {small_digest}" in res.stdout
            res = subprocess.run([str(ctl), "ai", "model", "jobs", "--json"], capture_output=True, text=True,
                                 env=env, timeout=60)
            assert res.returncode == 0 and {j["model"] for j in __import__("json").loads(res.stdout)} == {"slow", "small"}

            # A gated repository without a token fails with the cause, not the token.
            assert api.post("/api/ai/models", json={"name": "gated", "source": "hf://fab/gated"}).status_code == 201
            api.post("/api/ai/models/gated/materialize", json={"nodes": ["node-a"]})
            gated = finished(api, "gated")
            assert gated["state"] == "Failed"
            node_msg = gated["nodes"][0]["message"]
            assert "gated" in node_msg and "no Hugging Face token" in node_msg
            assert "hf_only_the_mirror_knows" not in str(api.get("/api/ai/model-jobs").json())
            res = subprocess.run([str(ctl), "ai", "model", "materialize", "gated", "--wait"], capture_output=True,
                                 text=True, env=env, timeout=120)
            assert res.returncode == 1 and "no Hugging Face token" in res.stderr
            retried = next(j for j in api.get("/api/ai/model-jobs").json() if j["model"] == "gated")
            assert retried["retries"] >= 1 and retried["attempt"] == 1

            # Bytes changed after Ready: verify fails the job and says why.
            small_dir = agent_cache / small_digest
            with open(small_dir / "config.json", "ab") as f:
                f.write(b"\n")
            bad = api.post("/api/ai/models/small/verify").json()
            assert bad["results"][0]["ok"] is False and "hash to" in bad["results"][0]["message"]
            assert status(api, "small")["nodes"][0]["state"] == "Failed"

            # A local source outside FABRIC_MODEL_DIR is refused at creation.
            r = api.post("/api/ai/models", json={"name": "etc", "source": "/srv/models/../../etc"})
            assert r.status_code == 422 and "outside FABRIC_MODEL_DIR" in r.text
    assert os.path.isdir(tmp_path)
