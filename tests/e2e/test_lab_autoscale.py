"""Autoscaling in the real lab (namespaces, XDP Maglev, fabricd, agent, engine sims): queue 20 on
the only replica scales the deployment out to 2 and both replicas' backends reach the live BPF
Maglev map; removing the load scales it back in to 1, the drained replica's backend leaves the
map, and new TCP connections through the VIP are all served.
Run under `flock /tmp/fabric-lab.lock` (the lab's names are fixed).
"""

from __future__ import annotations

import httpx
import pytest

from controlplane.lab.cluster import LAB_MODEL_SOURCE
from tests.e2e.lab_harness import running_lab
from tests.e2e.test_lab_rollout import connect, table
from tests.e2e.test_lab_story import Story
from tests.support.lab_lock import lab_unavailable
from tests.support.polling import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]

DEP, PROFILE, EP = "auto-llm", "auto-h100", "auto-llm-openai"


@pytest.fixture(scope="module")
def lab():
    with running_lab("e2e-as", reconcile_secs=1.0, routing_secs=1.0, autoscale_secs=1.0) as (cfg, handle):
        story = Story(cfg, handle.token)
        yield cfg, story.api, story.agent
        story.api.close()
        story.agent.close()


def test_queue_scales_out_into_the_bpf_map_and_back_in(lab):
    cfg, api, agent = lab
    assert api.post("/api/ai/models", json={"name": DEP, "source": LAB_MODEL_SOURCE}).status_code == 201
    assert api.post("/api/ai/profiles", json={"name": PROFILE, "runtime": "vllm", "cpu": 1, "memory_gib": 1,
                                              "gpu": {"count": 1, "vram_gib": 24}}).status_code == 201
    assert api.post("/api/ai/deployments", json={"name": DEP, "model": DEP, "profile": PROFILE,
                                                 "replicas": 1}).status_code == 201
    assert api.post("/api/ai/endpoints", json={"name": EP, "deployment": DEP}).status_code == 201
    vip = wait_for(lambda: api.get(f"/api/ai/endpoints/{EP}").json()["status"].get("vip"), 120, "a VIP")
    wait_for(lambda: len(table(agent, vip) or {}) == 1, 120, "1 backend in the BPF maps")
    spec = {"min_replicas": 1, "max_replicas": 2, "scale_out_queue": 5, "scale_out_seconds": 2,
            "scale_in_queue": 1, "scale_in_seconds": 3, "cooldown_seconds": 1}
    assert api.put(f"/api/ai/deployments/{DEP}/autoscaling", json=spec).status_code == 200

    first = next(iter(table(agent, vip)))
    assert httpx.post(f"http://{first}/sim/load", json={"waiting": 20}, timeout=5).status_code == 200
    wait_for(lambda: len(table(agent, vip) or {}) == 2, 120, "scale out: 2 backends in the BPF maps")
    assert api.get(f"/api/ai/deployments/{DEP}").json()["replicas"] == 2
    events = api.get("/api/ai/events", params={"object": f"deployment/{DEP}"}).json()
    assert "ScaledOut" in [e["reason"] for e in events]

    assert httpx.post(f"http://{first}/sim/load", json={"waiting": 0}, timeout=5).status_code == 200
    wait_for(lambda: len(table(agent, vip) or {}) == 1, 120, "scale in: 1 backend in the BPF maps")
    wait_for(lambda: len(api.get(f"/api/ai/deployments/{DEP}/metrics").json()["replicas"]) == 1, 60,
             "the drained replica deleted")
    assert connect(cfg, vip, 20, model=DEP) == 20
