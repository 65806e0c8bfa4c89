"""The guest sees the verified digest directory read-only at /models, and a VM create naming a
digest the node does not hold is refused."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest
from fastapi.testclient import TestClient

from agent.api import create_app
from agent.models.cache import ModelCache
from agent.models.jobs import ModelJobs, ModelSettings
from agent.state import AgentState
from agent.vm.base import VmSpec
from agent.vm.cloud_init import build_seed
from agent.vm.domain_xml import build_domain_xml
from agent.vm.host_tuning import HostTuning  # <readonly/> where libvirt/virtiofsd support it
from tests.support.agent_ops import finished

SPEC = VmSpec(replica_id="r-1", deployment="chat", model_name="demo", model_source="hf://org/demo",
              gpus=("0000:3b:00.0",), gpu_memory_mib=81_559, cpu=2, memory_gib=4)


def test_guest_mounts_the_digest_directory_read_only_and_serves_it(tmp_path):
    digest_dir = tmp_path / "models" / "by-digest" / ("a" * 64)
    digest_dir.mkdir(parents=True)
    spec = dataclasses.replace(SPEC, model_dir=str(digest_dir))
    xml = build_domain_xml(spec, overlay=tmp_path / "o.qcow2", seed_iso=tmp_path / "s.iso", mac="52:54:00:00:00:01",
                           bridge="fabric0", models_dir=digest_dir, tuning=HostTuning(virtiofs_readonly=True))
    share = ET.fromstring(xml).find("devices/filesystem")
    assert share.find("source").get("dir") == str(digest_dir)
    assert share.find("readonly") is not None and share.find("target").get("dir") == "models"
    _meta, user = build_seed(spec, hostname="fabric-r-1")
    assert "serve /models " in user  # the engine is pointed at the share itself
    assert "virtiofs" in user and "ro,nofail" in user


class NoVms:
    name = "none"

    def __init__(self):
        self.created = []

    def create(self, spec):
        self.created.append(spec)
        from agent.vm.base import VmStatus

        return VmStatus(spec.replica_id, "running", "127.0.0.1", spec.port)

    def get(self, vm_id):
        return None

    def list(self):
        return []

    def delete(self, vm_id):
        return False


class NoGpus:
    def read(self):
        return type("Inv", (), {"gpus": [], "message": "none"})()


def test_vm_create_needs_the_digest_on_this_node(tmp_path):
    cache = ModelCache(tmp_path / "models")
    jobs = ModelJobs(cache, ModelSettings(model_dir=str(tmp_path / "srv")))
    vms = NoVms()
    app = create_app(AgentState(node_id="node-a", vm_driver=vms, inventory=NoGpus(), models=jobs))
    body = {"replica_id": "r-1", "deployment": "chat", "model_name": "demo", "model_source": "hf://org/demo"}
    with TestClient(app) as c:
        missing = c.post("/v1/vms", json={**body, "model_digest": "b" * 64})
        assert missing.status_code == 409 and "not ready on node node-a" in missing.json()["error"]["message"]
        assert c.post("/v1/vms", json={**body, "model_digest": "../etc"}).status_code == 422
        (cache.by_digest / ("b" * 64)).mkdir()
        ok = finished(c, c.post("/v1/vms", json={**body, "model_digest": "b" * 64}))
        assert ok["state"] == "succeeded", ok
        assert c.get("/v1/models/jobs/nope").status_code == 404
        assert c.delete("/v1/models/cache/" + "c" * 64).status_code == 404
        metrics = c.get("/metrics").text
        assert "fabric_agent_model_cache_digests 1.0" in metrics
    assert vms.created[0].model_dir == str(cache.by_digest / ("b" * 64))
    assert (cache.last_used / ("b" * 64)).exists()  # a VM using it counts for LRU


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../../b", "a\\b", "ok/./x"])
def test_escaping_names_are_refused(name):
    from agent.models.checks import CheckFailed, scan_names

    with pytest.raises(CheckFailed, match="leaves the model directory"):
        scan_names([name])
