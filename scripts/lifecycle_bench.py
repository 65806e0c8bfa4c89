#!/usr/bin/env python3
"""drain_s and crashloop_park_s for scripts/bench-control (also runnable alone; prints one JSON object).

A real fabricd (controllers on) and a real fabric-agent with the dry-run driver, each replica a
real fabric-engine-sim on loopback (tests/integration/orchestration_harness), 50 tokens/s.

  drain_s             a replica with a 10 s stream in flight (500 tokens, opened straight to its
                      engine): from the drain asked (POST .../drain {"replica": ID}) to its record
                      deleted. drain_stream_remaining_s is the stream's time left when the drain was
                      asked, drain_after_stream_s the rest (the deletion after the stream ended: the
                      next scrape showing nothing running, at least FABRIC_ROUTING_SECS + 1 s after the
                      drain began, then the next reconcile pass; 1 s periods here), and
                      drain_stream_whole whether the stream still ended with data: [DONE]
  crashloop_park_s    a deployment whose engine dies each time it starts (the bench SIGKILLs every
                      engine of it as soon as its process is recorded): from the first kill to
                      the deployment in phase CrashLoop, with FABRIC_CRASHLOOP_AFTER=3 and a 1 s
                      backoff base (waits 0, 1 s); crashloop_failures the count it parked at
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from autoscale_reaction import _wait  # a sibling in scripts/, as bench-control imports both

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROUTING_S = 1.0
RECONCILE_S = 1.0
STREAM_TOKENS = 500  # 10 s at the simulator's 50 tokens/s
ENV = {"FABRIC_ROUTING_SECS": str(ROUTING_S), "FABRIC_RECONCILE_SECS": str(RECONCILE_S),
       "FABRIC_ADDRESS_POOL": "127.0.98.9", "FABRIC_CRASHLOOP_AFTER": "3", "FABRIC_CRASHLOOP_BACKOFF_SECS": "1",
       "FABRIC_CRASHLOOP_BACKOFF_MAX_SECS": "4", "FABRIC_DRAIN_GRACE_SECS": "60"}


def wait(pred, timeout: float, step: float = 0.05):
    """The autoscale bench's poll (scripts/autoscale_reaction.py), at this bench's finer step."""
    return _wait(pred, timeout, step)


def replicas(api: httpx.Client, dep: str) -> list[dict]:
    return api.get(f"/api/ai/deployments/{dep}/metrics").json()["replicas"]


def measure_drain(api: httpx.Client, dep: str) -> dict:
    """drain_s on a deployment with two ready replicas."""
    ready = wait(lambda: [r for r in replicas(api, dep) if r["ready"] and not r["draining"]], 60)
    victim = ready[0]
    url = f"http://{victim['host']}:{victim['port']}/v1/chat/completions"
    body = {"model": dep, "stream": True, "max_tokens": STREAM_TOKENS, "messages": [{"role": "user", "content": "hi"}]}
    result: dict = {}

    def stream() -> None:
        t0 = time.monotonic()
        with httpx.Client(timeout=60) as http, http.stream("POST", url, json=body) as r:
            text = "".join(r.iter_text())
        result.update(whole="data: [DONE]" in text, ended=time.monotonic(), started=t0)

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(1.0)  # the stream runs; about 9 s left
    asked = time.monotonic()
    api.post(f"/api/ai/deployments/{dep}/drain", json={"replica": victim["replica_id"], "grace_secs": 60}
             ).raise_for_status()
    wait(lambda: victim["replica_id"] not in {r["replica_id"] for r in replicas(api, dep)}, 90)
    drain_s = time.monotonic() - asked
    t.join(60)
    return {"drain_replica": victim["replica_id"], "drain_s": round(drain_s, 2), "drain_stream_remaining_s": round(result["ended"] - asked, 2),
            "drain_stream_whole": result["whole"],
            "drain_after_stream_s": round(drain_s - (result["ended"] - asked), 2)}


def engine_killer(agent_dir: Path, dep: str, stop: threading.Event, killed: list[float]) -> None:
    """SIGKILL every recorded engine of deployment DEP as soon as it runs (a model that never
    loads), noting when each kill happened."""
    seen: set[int] = set()
    while not stop.is_set():
        for record in agent_dir.rglob(f"{dep}-*.json"):
            try:
                pid = int(json.loads(record.read_text())["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if pid in seen:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            seen.add(pid)
            killed.append(time.monotonic())
        stop.wait(0.05)


def measure_crashloop(api: httpx.Client, agent_dir: Path, dep: str) -> dict:
    """crashloop_park_s on a one-replica deployment whose engines are killed as they start."""
    stop, killed = threading.Event(), []
    t = threading.Thread(target=engine_killer, args=(agent_dir, dep, stop, killed), daemon=True)
    t.start()
    try:
        status = wait(lambda: (d := api.get(f"/api/ai/deployments/{dep}").json()["status"])["phase"] == "CrashLoop"
                      and d, 120)
        parked_at = time.monotonic()
    finally:
        stop.set()
        t.join(5)
    return {"crashloop_park_s": round(parked_at - killed[0], 2), "crashloop_failures": status["failures"],
            "crashloop_kills": len(killed), "crashloop_last_failure": status["last_failure"][:160]}


def bench_lifecycle() -> dict:
    from tests.integration.orchestration_harness import deploy, start_cluster

    with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as tmp, \
            start_cluster(Path(tmp), gpus=4, env=ENV) as cluster, cluster.api() as api:
        deploy(api, "drainb", "drainb-ep", 2)
        out = measure_drain(api, "drainb")
        r = api.post("/api/ai/deployments", json={"name": "crashb", "model": "drainb", "profile": "g1", "replicas": 1})
        r.raise_for_status()
        out.update(measure_crashloop(api, Path(tmp) / "agent", "crashb"))
        out["lifecycle_where"] = "fabricd + dry-run fabric-agent + fabric-engine-sim on loopback"
        return out


if __name__ == "__main__":
    print(json.dumps(bench_lifecycle(), indent=2))
