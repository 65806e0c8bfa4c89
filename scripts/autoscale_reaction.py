#!/usr/bin/env python3
"""autoscale_reaction_s for scripts/bench-control (also runnable alone; prints one JSON object).

A real fabricd (controllers on) and a real fabric-agent with the dry-run driver, each replica a
real fabric-engine-sim on loopback (tests/integration/orchestration_harness). One replica with
autoscaling 1-2 (scale_out_queue 5, scale_out_seconds SCALE_OUT_S); then /sim/load puts 20
requests in its queue and the clock runs until the second replica is Ready.

  autoscale_reaction_s     from the queue crossing the threshold (the /sim/load answer) to the
                           new replica Ready (polled every 0.1 s through the API)
  autoscale_replica_start_s  the new replica's own start: its record's created_at to Ready
  autoscale_target_s       scale_out_seconds + one autoscale tick + one routing period (the scrape
                           that sees the queue) + the replica's start: the issue's bound
  autoscale_reaction_vs_target  the ratio of the two (<= 1 meets it)
The lab (XDP, netns replicas) would add only the namespace setup to the start time; this runs
without root or the lab lock.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SCALE_OUT_S = 5.0
AUTOSCALE_S = 2.0
ROUTING_S = 1.0


def _wait(pred, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError("condition not met")


def bench_autoscale_reaction() -> dict:
    from tests.integration.orchestration_harness import deploy, start_cluster

    env = {"FABRIC_AUTOSCALE_SECS": str(AUTOSCALE_S), "FABRIC_ROUTING_SECS": str(ROUTING_S),
           "FABRIC_RECONCILE_SECS": "1", "FABRIC_ADDRESS_POOL": "127.0.98.7"}
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as tmp, \
            start_cluster(Path(tmp), gpus=2, env=env) as cluster, cluster.api() as api, \
            httpx.Client(timeout=5) as plain:
        deploy(api, "bench", "bench-ep", 1)

        def ready() -> list[dict]:
            reps = api.get("/api/ai/deployments/bench/metrics").json()["replicas"]
            return [r for r in reps if r["ready"] and not r["draining"]]

        first = _wait(lambda: ready(), 60)[0]
        spec = {"min_replicas": 1, "max_replicas": 2, "scale_out_queue": 5, "scale_out_seconds": SCALE_OUT_S,
                "scale_in_queue": 1, "scale_in_seconds": 600, "cooldown_seconds": 60}
        api.put("/api/ai/deployments/bench/autoscaling", json=spec).raise_for_status()
        plain.post(f"http://{first['host']}:{first['port']}/sim/load", json={"waiting": 20}).raise_for_status()
        t0 = time.time()
        second = _wait(lambda: [r for r in ready() if r["replica_id"] != first["replica_id"]], 120)[0]
        reaction = time.time() - t0
        record = next(r for r in api.get("/api/ai/deployments/bench/metrics").json()["replicas"]
                      if r["replica_id"] == second["replica_id"])
        created = api.get("/api/ai/explain/failure/" + record["replica_id"]).json()["current"]["created_at"]
        start_s = max(0.0, t0 + reaction - created)
        target = SCALE_OUT_S + AUTOSCALE_S + ROUTING_S + start_s
        return {
            "autoscale_reaction_s": round(reaction, 2),
            "autoscale_replica_start_s": round(start_s, 2),
            "autoscale_scale_out_seconds": SCALE_OUT_S,
            "autoscale_tick_s": AUTOSCALE_S,
            "autoscale_routing_s": ROUTING_S,
            "autoscale_target_s": round(target, 2),
            "autoscale_reaction_vs_target": round(reaction / target, 2),
            "autoscale_where": "fabricd + dry-run fabric-agent + fabric-engine-sim on loopback",
        }


if __name__ == "__main__":
    import json

    print(json.dumps(bench_autoscale_reaction(), indent=2))
