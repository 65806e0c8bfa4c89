"""Capacity classes end to end: real fabricd (controllers on, 1 s periods) and a real agent with
the dry-run driver and 2 fake GPUs, every replica a real engine-sim process.

Story: an opportunistic deployment fills the node (2 replicas) with a stream running on each;
a critical deployment of 1 replica preempts one of them through the drain (weight 0, the stream
finishes, then deleted), the opportunistic deployment says why (status, event, explain failure);
the critical one scaled to 0 gives the room back and the opportunistic replica returns."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import httpx
import pytest

from lab.rigs.polling import wait_for
from tests.controlplane.conftest import BIN
from tests.integration.orchestration_harness import start_cluster

# full (scripts/test-full; 40 s): make test keeps the planner's rule (tests/controlplane/placement/)
# and drains that cut no stream (tests/e2e/test_lab_no_drop.py); docs/reliability.md "The full profile"
pytestmark = [pytest.mark.e2e, pytest.mark.full]


def stream(url: str, out: list) -> None:
    body = {"model": "qwen", "prompt": "hello", "max_tokens": 300, "stream": True}
    try:
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
            text = "".join(r.iter_text())
        out.append("done" if "data: [DONE]" in text else f"stream cut: {r.status_code} {text[-200:]}")
    except httpx.HTTPError as exc:
        out.append(f"stream cut: {type(exc).__name__}")


def ctl(cluster, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_URL=cluster.url, FABRIC_TOKEN=cluster.token, HOME=str(cluster.state_dir))
    proc = subprocess.run([str(BIN / "fabricctl"), "ai", *args], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def status(api, name) -> dict:
    return api.get(f"/api/ai/deployments/{name}").json()["status"]


def replicas(api, name) -> list[dict]:
    return api.get(f"/api/ai/deployments/{name}/metrics").json()["replicas"]


def test_critical_preempts_opportunistic_through_the_drain_and_it_returns(tmp_path):
    with start_cluster(tmp_path, gpus=2, env={"FABRIC_DRAIN_GRACE_SECS": "40"}) as cluster, cluster.api() as api:
        assert api.post("/api/ai/models", json={"name": "qwen", "source": "hf://Qwen/Qwen3-8B"}).status_code == 201
        assert api.post("/api/ai/profiles", json={"name": "g1", "gpu": {"count": 1, "vram_gib": 24}, "cpu": 1,
                                                  "memory_gib": 1}).status_code == 201
        r = api.post("/api/ai/deployments", json={"name": "batch", "model": "qwen", "profile": "g1", "replicas": 2,
                                                  "capacity_class": "opportunistic"})
        assert r.status_code == 201 and r.json()["capacity_class"] == "opportunistic", r.text
        try:
            wait_for(lambda: sum(x["ready"] for x in replicas(api, "batch")) == 2, 90, "2 opportunistic replicas")
        except AssertionError:
            raise AssertionError(cluster.tail()) from None
        before = {x["replica_id"]: x for x in replicas(api, "batch")}
        fit = api.get("/api/ai/capacity/fit", params={"profile": "g1"}).json()
        assert (fit["fits"], fit["with_preemption"], fit["binding"]) == (0, {"standard": 2, "critical": 2}, "GPUs")
        assert api.get("/api/ai/capacity/fit", params={"profile": "nope"}).status_code == 404
        assert api.get("/api/ai/capacity/fit", params={"profile": "Bad Name"}).status_code == 422
        table = ctl(cluster, "capacity", "fit", "--profile", "g1")
        assert "0 more replica(s) of g1 fit now; with preemption: 2 as standard, 2 as critical" in table, table
        assert json.loads(ctl(cluster, "capacity", "fit", "--profile", "g1", "-o", "json"))["nodes"][0]["binding"] \
            == "GPUs"
        assert "GPUS_FREE" in ctl(cluster, "capacity")
        assert api.get("/api/ai/capacity").json()["gpus_by_class"] == {"opportunistic": 2, "standard": 0,
                                                                      "critical": 0}

        # A stream on each opportunistic replica, running while the preemption happens.
        results: list[str] = []
        threads = [threading.Thread(target=stream, args=(f"http://{x['host']}:{x['port']}", results))
                   for x in before.values()]
        for t in threads:
            t.start()

        # the operator's way: fabricctl ai deploy --capacity-class
        out = ctl(cluster, "deploy", "qwen", "--profile", "g1", "--name", "chat", "--capacity-class", "critical")
        assert "deployment chat created" in out, out
        assert api.get("/api/ai/deployments/chat").json()["capacity_class"] == "critical"
        wait_for(lambda: status(api, "batch").get("preempted") == 1, 30, "one opportunistic replica preempted")
        wait_for(lambda: "1 replica(s) preempted by chat" in status(api, "batch")["message"], 30, "the reason shown")
        assert status(api, "batch")["preempted_by"] == "chat"
        draining = [x for x in api.get("/api/ai/explain/placement/batch").json()["replicas"]
                    if x["phase"] == "Draining"]
        assert len(draining) == 1, draining
        victim = draining[0]["replica_id"]
        # explain placement runs the same planner: room on its way (the draining victim), or whom a
        # further critical replica would take.
        shown = api.get("/api/ai/explain/placement/chat").json()
        assert shown["capacity_class"] == "critical" and shown["node"] is None, shown
        assert shown["preemption"]["outcome"] in ("waiting", "preempt"), shown["preemption"]
        assert shown["preemption"]["waiting_on"] == [victim] or shown["preemption"]["victims"], shown["preemption"]
        explain = api.get(f"/api/ai/explain/failure/{victim}").json()
        assert "preempted by chat" in explain["summary"], explain
        events = api.get("/api/ai/events", params={"kind": "deployment", "name": "batch"}).json()
        assert any(e["action"] == "Preempted" and e["type"] == "Warning" for e in events), events

        try:
            wait_for(lambda: any(x["ready"] for x in replicas(api, "chat")), 90, "the critical replica Ready")
        except AssertionError:
            raise AssertionError(cluster.tail()) from None
        for t in threads:
            t.join(60)
        assert results == ["done", "done"], results  # the drain let the preempted replica's stream finish
        assert victim not in {x["replica_id"] for x in replicas(api, "batch")}
        assert status(api, "batch")["preempted"] == 1, "\n".join(
            f"{e['name']} {e['action']} {e['message']}" for e in api.get("/api/ai/events", params={"limit": 200}).json()) + cluster.tail()

        # Room returns: the critical deployment scales to 0 and the opportunistic replica comes back.
        assert api.post("/api/ai/deployments/chat/scale", json={"replicas": 0}).status_code == 200
        wait_for(lambda: status(api, "batch").get("preempted") == 0
                 and sum(x["ready"] for x in replicas(api, "batch")) == 2, 120, "the preempted replica back")
        assert status(api, "batch")["preempted_by"] == ""
