"""LoRA adapters from the model supply chain to a call, lab-free: real fabricd, a real fabric-agent
(dry-run VMs: each replica a real fabric-engine-sim process), the loopback HF mirror with the real
huggingface_hub client, and a real fabric-gateway.

A model with two adapters is added with fabricctl (--adapter NAME=SOURCE) and deployed: the agent fetches the model and the adapters (the stored
job names each adapter's digest, the model pins each adapter's commit), the replica starts with
the adapter set as what it sees at /adapters, and a call for an adapter through the gateway makes
the engine load it from the fetched files (``lora_path`` /adapters/NAME). An adapter whose files
are gone from the node fails the load loudly (503 adapter_load_failed), never silently."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from agent.models.checks import build_manifest
from common.store.connect import open_store
from lab.hf_mirror import commit_of
from lab.rigs.polling import wait_for
from lab.tiny_model import write_tiny_adapter, write_tiny_model
from tests.gateway.gateway_harness import HMAC_SECRET, GatewayProcess, make_key
from tests.integration.orchestration_harness import BIN, start_cluster

# full (scripts/test-full; 14 s); make test covers it with an adapter loaded on its first call through the gateway on the real engine (tests/e2e/test_lab_real_engine.py)
pytestmark = [pytest.mark.e2e, pytest.mark.full]


def test_adapters_are_fetched_shared_and_loaded_from_the_fetched_files(tmp_path):
    env = {"FABRIC_ADDRESS_POOL": "127.0.99.9", "FABRIC_KEY_HMAC_SECRET": HMAC_SECRET}
    with start_cluster(tmp_path, gpus=1, env=env) as cluster:
        root = cluster.mirror.cfg.root
        write_tiny_model(root / "fab" / "base", seed=5)
        sql = write_tiny_adapter(root / "fab" / "sql-lora", rank=16, base="fab/base")
        poem = write_tiny_adapter(root / "fab" / "poem-lora", rank=8, seed=2, base="fab/base")
        cli_env = {**os.environ, "FABRIC_URL": cluster.url, "FABRIC_TOKEN": cluster.token}

        def fabricctl(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(BIN / "fabricctl"), "ai", "model", "add", "base", "--source", "hf://fab/base",
                                   *args], capture_output=True, text=True, env=cli_env)

        bad = fabricctl("--adapter", "sql")
        assert bad.returncode == 2 and "NAME=SOURCE" in bad.stderr
        added = fabricctl("--adapter", "sql=hf://fab/sql-lora", "--adapter", "poem=hf://fab/poem-lora",
                          "--max-loaded-adapters", "2")
        assert added.returncode == 0, added.stderr
        with cluster.api() as api:
            model = api.get("/api/ai/models/base").json()
            assert [(a["name"], a["source"]) for a in model["adapters"]] == [("sql", "hf://fab/sql-lora"),
                                                                             ("poem", "hf://fab/poem-lora")]
            assert model["max_loaded_adapters"] == 2
            assert api.post("/api/ai/profiles", json={"name": "g1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1,
                                                      "memory_gib": 1}).status_code == 201
            r = api.post("/api/ai/deployments", json={"name": "base", "model": "base", "profile": "g1", "replicas": 1})
            assert r.status_code == 201, r.text
            assert api.post("/api/ai/endpoints", json={"name": "lora", "deployment": "base"}).status_code == 201
            wait_for(lambda: api.get("/api/ai/deployments/base").json()["status"]["ready_replicas"] == 1, 90,
                     "the replica to start once the model and its adapters are Ready")
            job = next(j for j in api.get("/api/ai/model-jobs").json() if j["model"] == "base")
            assert job["state"] == "Ready"
            assert {n: a["digest"] for n, a in job["adapters"].items()} == {
                "sql": build_manifest(sql).digest, "poem": build_manifest(poem).digest}
            pinned = wait_for(lambda: api.get("/api/ai/models/base").json()["status"]["adapter_revisions"] or None,
                              15, "the adapters' commits pinned on the model")
            assert pinned == {"sql": commit_of(sql), "poem": commit_of(poem)}
            shown = api.get("/api/ai/models/base/status").json()
            assert shown["adapters"] == ["sql", "poem"] and shown["nodes"][0]["adapters"] == {
                "poem": build_manifest(poem).digest, "sql": build_manifest(sql).digest}
            replica = api.get("/api/ai/deployments/base/metrics").json()["replicas"][0]
            engine = f"http://{replica['host']}:{replica['port']}"

        store = open_store(f"sqlite://{cluster.state_dir}/fabric.db")
        gw = GatewayProcess.start(tmp_path, f"sqlite://{cluster.state_dir}/fabric.db",
                                  env={"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
        try:
            _, key = make_key(store, "lora")
            client = openai.OpenAI(base_url=gw.openai_base("lora"), api_key=key, max_retries=6, timeout=30)
            answer = client.chat.completions.create(model="sql", max_tokens=2,
                                                    messages=[{"role": "user", "content": "hi"}])
            assert answer.model == "sql"
            cards = {c["id"]: c for c in httpx.get(engine + "/v1/models").json()["data"]}
            assert cards["sql"]["root"] == "/adapters/sql" and cards["sql"]["parent"] == "base"
            assert httpx.get(engine + "/sim/state").json()["lora"]["loaded"] == ["sql"]

            # The set the replica sees holds exactly the fetched files; take poem's away on the node.
            sets = sorted(Path(tmp_path / "agent").rglob("adapter-sets/*/poem"))
            assert len(sets) == 1 and build_manifest(sets[0]).digest == build_manifest(poem).digest
            shutil.rmtree(sets[0])
            missing = httpx.post(gw.openai_base("lora") + "/chat/completions", timeout=30,
                                 headers={"authorization": f"Bearer {key}"},
                                 json={"model": "poem", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})
            assert missing.status_code == 503 and missing.json()["error"]["code"] == "adapter_load_failed", missing.text
            assert httpx.get(engine + "/sim/state").json()["lora"]["loaded"] == ["sql"]
        finally:
            gw.stop()
            store.close()
