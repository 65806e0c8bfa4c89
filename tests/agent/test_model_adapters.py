"""A model's LoRA adapters in the supply chain, against the loopback HF mirror and the real
huggingface_hub client: fetched and checked with the model (same states, digests, cache),
refused by name, joined into the set a replica sees at /adapters, given to the VM create."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from agent.api import create_app
from agent.models import adapter_sets
from agent.models.checks import build_manifest
from agent.state import AgentState
from agent.vm.cloud_init import build_seed
from agent.vm.domain_xml import build_domain_xml
from agent.vm.host_tuning import HostTuning
from common.model_api import AdapterSource
from lab.hf_mirror import commit_of
from lab.tiny_model import write_tiny_adapter
from tests.agent.model_support import REPO, finish, jobs_for, mirror, request, states
from tests.agent.test_model_vm import NoGpus, NoVms
from tests.support.agent_ops import finished

EVERY = ["Resolving", "Downloading", "Verifying", "Scanning"]


def test_adapters_are_fetched_and_checked_with_the_model(tmp_path):
    local = write_tiny_adapter(tmp_path / "srv-models" / "adapters" / "poem", rank=64, seed=3)
    with mirror(tmp_path) as m:
        sql = write_tiny_adapter(m.cfg.root / "fab" / "sql-lora", rank=16)
        jobs = jobs_for(tmp_path, m.url)
        adapters = [AdapterSource(name="sql", source="hf://fab/sql-lora"),
                    AdapterSource(name="poem", source=f"file://{local}")]
        jobs.submit(request(adapters=adapters))
        view = finish(jobs, "tiny.node-a")
        assert view.state == "Ready", view.message
        # The model, then each adapter through the same states (a local one is hashed in place).
        assert states(view) == ["Registered", *EVERY, *EVERY, "Resolving", "Verifying", "Scanning", "Ready"]
        assert view.digest == build_manifest(m.cfg.root / REPO).digest  # the model's digest is its own
        assert {n: a.digest for n, a in view.adapters.items()} == {"sql": build_manifest(sql).digest,
                                                                   "poem": build_manifest(local).digest}
        assert view.adapters["sql"].revision == commit_of(sql) and view.adapters["sql"].files == 2
        model_bytes = build_manifest(m.cfg.root / REPO).size
        assert view.bytes_done == view.bytes_total == model_bytes + sum(a.size_bytes for a in view.adapters.values())
        assert view.files == 6  # the model's own count
        assert sorted(jobs.cache.digests()) == sorted([view.digest, *(a.digest for a in view.adapters.values())])
        assert "2 adapters" in view.message

        # A second model with the same adapter: the cache already holds it (no second download).
        fetched = len([r for r in m.cfg.requests if "sql-lora/resolve" in r[1] and r[0] == "GET"])
        jobs.submit(request(job="other.node-a", adapters=adapters[:1]))
        again = finish(jobs, "other.node-a")
        assert again.state == "Ready" and again.adapters["sql"].digest == view.adapters["sql"].digest
        assert len([r for r in m.cfg.requests if "sql-lora/resolve" in r[1] and r[0] == "GET"]) == fetched


@pytest.mark.parametrize("make, source, expected, message", [
    (None, "hf://fab/missing-lora", None, "adapter ghost: repository fab/missing-lora was not found"),
    ("pickle", "hf://fab/pickled-lora", None, "adapter ghost: adapter.pt is a pickle file"),
    ("ok", "hf://fab/ok-lora", "0" * 64, "adapter ghost: checksum mismatch"),
])
def test_a_refused_adapter_fails_the_job_naming_it(tmp_path, make, source, expected, message):
    with mirror(tmp_path) as m:
        repo = m.cfg.root / source.removeprefix("hf://")
        if make:
            write_tiny_adapter(repo)
            if make == "pickle":  # pickle-only weights (beside safetensors a .pt is skipped, not fetched)
                (repo / "adapter_model.safetensors").unlink()
                (repo / "adapter.pt").write_bytes(b"\x80\x04.")
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request(adapters=[AdapterSource(name="ghost", source=source, expected_digest=expected)]))
        view = finish(jobs, "tiny.node-a")
    assert view.state == "Failed" and message in view.message, view.message
    assert view.digest is None and view.adapters == {}  # never Ready without every adapter


def test_the_adapter_set_links_the_cache_and_goes_with_eviction(tmp_path):
    with mirror(tmp_path) as m:
        for name, rank in (("sql", 16), ("poem", 100)):
            write_tiny_adapter(m.cfg.root / "fab" / f"{name}-lora", rank=rank)
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request(adapters=[AdapterSource(name=n, source=f"hf://fab/{n}-lora") for n in ("sql", "poem")]))
        view = finish(jobs, "tiny.node-a")
    digests = {n: a.digest for n, a in view.adapters.items()}
    cache = jobs.cache
    one = adapter_sets.build(cache, digests)
    assert adapter_sets.build(cache, dict(reversed(list(digests.items())))) == one  # order does not matter
    for name, digest in digests.items():
        assert build_manifest(one / name).digest == digest  # the adapter's files, nothing else
        src = cache.path_for(digest) / "adapter_model.safetensors"
        assert (one / name / "adapter_model.safetensors").stat().st_ino == src.stat().st_ino  # a hard link
    assert adapter_sets.max_lora_rank(one) == 128  # rank 100 rounds up to a rank vLLM accepts
    only_sql = adapter_sets.build(cache, {"sql": digests["sql"]})
    assert only_sql != one and adapter_sets.max_lora_rank(only_sql) == 16
    with pytest.raises(adapter_sets.AdapterMissing, match="adapter x: digest"):
        adapter_sets.build(cache, {"x": "e" * 64})
    with pytest.raises(ValueError, match="DNS label"):
        adapter_sets.build(cache, {"../x": digests["sql"]})

    app = create_app(AgentState(node_id="node-a", vm_driver=NoVms(), inventory=NoGpus(), models=jobs))
    with TestClient(app) as c:
        assert c.delete(f"/v1/models/cache/{digests['poem']}").status_code == 204
    assert not one.exists() and only_sql.is_dir()  # the set holding the evicted adapter went with it
    assert (only_sql / "sql" / "adapter_config.json").is_file()


def test_vm_create_shares_the_adapters_and_sizes_vllm_for_them(tmp_path):
    with mirror(tmp_path) as m:
        write_tiny_adapter(m.cfg.root / "fab" / "sql-lora", rank=32)
        jobs = jobs_for(tmp_path, m.url)
        jobs.submit(request(adapters=[AdapterSource(name="sql", source="hf://fab/sql-lora")]))
        view = finish(jobs, "tiny.node-a")
    vms = NoVms()
    app = create_app(AgentState(node_id="node-a", vm_driver=vms, inventory=NoGpus(), models=jobs))
    body = {"replica_id": "r-1", "deployment": "chat", "model_name": "tiny", "model_source": f"hf://{REPO}",
            "model_digest": view.digest, "adapter_digests": {"sql": view.adapters["sql"].digest}, "max_loras": 3}
    with TestClient(app) as c:
        missing = c.post("/v1/vms", json={**body, "replica_id": "r-0", "adapter_digests": {"sql": "d" * 64}})
        assert missing.status_code == 409 and "adapter sql" in missing.json()["error"]["message"]
        assert c.post("/v1/vms", json={**body, "adapter_digests": {"../x": "d" * 64}}).status_code == 422
        write_tiny_adapter(jobs.cache.by_digest / ("f" * 64), rank=1024)  # more than vLLM loads
        huge = c.post("/v1/vms", json={**body, "replica_id": "r-9", "adapter_digests": {"big": "f" * 64}})
        assert huge.status_code == 422 and huge.json()["error"]["code"] == "bad_adapter"
        assert "adapter big has LoRA rank 1024" in huge.json()["error"]["message"]
        assert finished(c, c.post("/v1/vms", json=body))["state"] == "succeeded"
        other = finished(c, c.post("/v1/vms", json={**body, "replica_id": "r-2", "runtime": "tensorrt-llm"}))
        assert other["state"] == "succeeded", other
    spec = vms.created[0]
    assert (Path(spec.adapters_dir) / "sql" / "adapter_config.json").is_file()
    assert (spec.max_loras, spec.max_lora_rank) == (3, 32)
    assert vms.created[1].adapters_dir is None  # no runtime LoRA API: nothing shared

    xml = build_domain_xml(spec, overlay=tmp_path / "o.qcow2", seed_iso=tmp_path / "s.iso",
                           mac="52:54:00:00:00:01", bridge="fabric0", models_dir=Path(spec.model_dir),
                           tuning=HostTuning(virtiofs_readonly=True), adapters_dir=Path(spec.adapters_dir))
    shares = {fs.find("target").get("dir"): fs for fs in ET.fromstring(xml).findall("devices/filesystem")}
    assert shares["adapters"].find("source").get("dir") == spec.adapters_dir
    assert shares["adapters"].find("readonly") is not None and shares["models"].find("readonly") is not None
    _meta, user = build_seed(spec, hostname="fabric-r-1")
    assert "--enable-lora --max-loras 3 --max-lora-rank 32" in user
    assert "Environment=VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in user
    assert "- adapters\n  - /adapters\n  - virtiofs\n  - ro,nofail" in user
    assert "mount /adapters" in user  # the retried mount unit, which the engine unit requires
    _meta, plain = build_seed(dataclasses.replace(spec, adapters_dir=None), hostname="fabric-r-1")
    assert "--tensor-parallel-size 1\n" in plain  # nothing (no LoRA flag) after the TP flag
    assert "Environment=VLLM_ALLOW" not in plain and "mount /adapters" not in plain
