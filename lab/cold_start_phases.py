"""A cold start measured by phase in the lab (scripts/bench-coldstart, tests/e2e/test_lab_real_engine.py).

From the first call at zero replicas to its first token, through the gateway: a thread sends one
streamed chat (the caller's ``stream()``, which yields the content pieces as they arrive) while
this module polls fabricd and the engine, and notes when each phase was first seen, in seconds
from the call:
  wake          the deployment wants a replica (the autoscaler acted on the call's demand)
  placement     a replica record exists on a node
  model_files   the replica left Pending, or its engine runs, whichever is seen first: its node
                found the model's files present and checked (the agent creates the replica's VM,
                here its engine, only after that gate; fabricd's record can lag the launch)
  engine        the engine's processes run (the replica's network namespace holds a process)
  health        the engine's own GET /health answers 200
  ready         fabricd marks the replica Ready (the gateway routes to it from here)
  first_token   the call's first content piece reached the client
and the phases fabricd's explain routing showed for the endpoint meanwhile (common.cold_phase,
the function the gateway's held calls are explained by), in the order seen.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import httpx

ORDER = ("wake", "placement", "model_files", "engine", "health", "ready", "first_token")
POLL_S = 0.2


def _netns_busy(ns: str) -> bool:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return out.returncode == 0 and bool(out.stdout.split())


def measure(api: httpx.Client, deployment: str, endpoint: str, stream: Callable[[], Iterator[str]],
            netns_prefix: str = "fabric-lab-r-", timeout_s: float = 600.0) -> dict:
    """Run ``stream`` (a call at zero replicas) and time its cold start; returns
    {"phases_s": {phase: seconds}, "explain": [phases in order], "text": ..., "error": ...}."""
    seen: dict[str, float] = {}
    explained: list[str] = []
    result: dict = {"text": "", "error": None}
    t0 = time.monotonic()

    def call() -> None:
        try:
            for piece in stream():
                if piece and "first_token" not in seen:
                    seen["first_token"] = time.monotonic() - t0
                result["text"] += piece
        except Exception as exc:  # noqa: BLE001 - reported with the figures
            result["error"] = repr(exc)[:500]

    caller = threading.Thread(target=call, daemon=True)
    caller.start()

    def note(phase: str) -> None:
        seen.setdefault(phase, time.monotonic() - t0)

    while caller.is_alive() and time.monotonic() - t0 < timeout_s:
        try:
            dep = api.get(f"/api/ai/deployments/{deployment}").json()
            if dep.get("replicas", 0) > 0:
                note("wake")
            reps = api.get(f"/api/ai/deployments/{deployment}/metrics").json()["replicas"]
            cold = api.get(f"/api/ai/explain/routing/{endpoint}").json().get("cold_start")
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(POLL_S)
            continue
        if cold and (not explained or explained[-1] != cold["phase"]):
            explained.append(cold["phase"])
        for r in reps:
            note("placement")
            if r["phase"] != "Pending":
                note("model_files")
            if "engine" not in seen and _netns_busy(netns_prefix + r["replica_id"]):
                note("model_files")  # the engine starts only after the files' gate; its record may lag
                note("engine")
            if r.get("host") and "health" not in seen:
                try:
                    if httpx.get(f"http://{r['host']}:{r['port']}/health", timeout=2).status_code == 200:
                        note("health")
                except httpx.HTTPError:
                    pass
            if r["ready"]:
                note("ready")
        time.sleep(POLL_S)
    caller.join(max(0.0, timeout_s - (time.monotonic() - t0)))
    # A phase the poller stepped over (faster than a poll) happened no later than the next one seen.
    for i in range(len(ORDER) - 2, -1, -1):
        if ORDER[i] not in seen and ORDER[i + 1] in seen:
            seen[ORDER[i]] = seen[ORDER[i + 1]]
    return {"phases_s": {p: round(seen[p], 2) for p in ORDER if p in seen}, "explain": explained,
            "text": result["text"], "error": result["error"], "total_s": round(time.monotonic() - t0, 2)}
