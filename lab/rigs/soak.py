"""Soak on the loopback rig (lab.rigs.chaos_rig): mixed traffic with scaling and rollouts
running, sampled over time. scripts/soak is the command line.

Traffic (one thread each, through both gateways in turn): chat, streaming chat, embeddings, and
WebSocket sessions (five echoed messages on the engine's /v1/realtime through the gateway's
bridge). Operations: every ``scale_every`` seconds the deployment scales between 2 and 3
replicas; every ``rollout_every`` seconds a new revision is rolled out as a canary (50 % for 5 s,
then 100 %). Every ``interval`` seconds a sample: per long-lived process RSS and open fds (from
/proc; for the gateways also by kind of mapping, common.process_memory), asyncio tasks (its fabric_process_asyncio_tasks gauge; etcd is Go: none), the store's
size (etcd dbSize and dbSizeInUse, key count) and the calls of each kind and their errors since
the last sample. ``summarize`` reduces the samples to growth per process and error totals.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import httpx
from websockets.sync.client import connect as ws_connect

from common.process_memory import rss_by_mapping
from common.runtime_metrics import open_fds, rss_bytes
from lab.rigs.chaos_rig import DEP, EP, Rig
from lab.rigs.polling import scrape_gauge
from tests.gateway.gateway_harness import make_key

KINDS = ("chat", "stream", "embeddings", "websocket")
TIMEOUT_S = 10.0


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)  # (kind, what) -> count
    ops: list[dict] = field(default_factory=list)

    def note(self, kind: str, error: str = "") -> None:
        with self.lock:
            self.calls[kind] += 1
            if error:
                self.errors[(kind, error)] += 1

    def take(self) -> tuple[dict, dict]:
        with self.lock:
            calls, errors = dict(self.calls), {f"{k}: {w}": n for (k, w), n in self.errors.items()}
            self.calls.clear()
            self.errors.clear()
        return calls, errors


def _one(kind: str, http: httpx.Client, gw, key: str) -> str:
    """One call of KIND through gateway GW; returns "" or what went wrong."""
    base = gw.openai_base(EP)
    msgs = [{"role": "user", "content": "soak"}]
    if kind == "websocket":
        url = gw.url.replace("http://", "ws://") + f"/api/ai/openai/{EP}/v1/realtime?model={DEP}"
        with ws_connect(url, additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=TIMEOUT_S) as ws:
            for i in range(5):
                ws.send(f"m{i}")
                if ws.recv(timeout=TIMEOUT_S) != f"m{i}":
                    return "echo mismatch"
        return ""
    if kind == "stream":
        with http.stream("POST", base + "/chat/completions",
                         json={"model": DEP, "messages": msgs, "max_tokens": 16, "stream": True}) as r:
            if r.status_code != 200:
                return f"http {r.status_code}"
            return "" if "data: [DONE]" in "".join(r.iter_text()) else "stream cut"
    if kind == "chat":
        r = http.post(base + "/chat/completions", json={"model": DEP, "messages": msgs, "max_tokens": 16})
    else:
        r = http.post(base + "/embeddings", json={"model": DEP, "input": ["soak one", "soak two"]})
    return "" if r.status_code == 200 else f"http {r.status_code}"


def traffic(rig: Rig, key: str, kind: str, tally: Tally, stop: threading.Event, pause: float) -> None:
    with httpx.Client(timeout=TIMEOUT_S, headers={"authorization": f"Bearer {key}"}) as http:
        i = 0
        while not stop.is_set():
            gw = rig.gateways[i % len(rig.gateways)]
            i += 1
            try:
                error = _one(kind, http, gw, key)
            except Exception as exc:  # noqa: BLE001 - every failure is counted by its kind
                error = type(exc).__name__
            tally.note(kind, error)
            stop.wait(pause)


def operations(rig: Rig, tally: Tally, stop: threading.Event, scale_every: float, rollout_every: float) -> None:
    t0 = time.monotonic()
    next_scale, next_rollout, replicas, revision_args = scale_every, rollout_every, 2, ["--enforce-eager"]
    with rig.api() as api:
        while not stop.wait(1.0):
            now = time.monotonic() - t0
            try:
                if now >= next_scale:
                    next_scale += scale_every
                    replicas = 3 if replicas == 2 else 2
                    r = api.post(f"/api/ai/deployments/{DEP}/scale", json={"replicas": replicas})
                    tally.ops.append({"t": round(now), "op": f"scale to {replicas}", "status": r.status_code})
                if now >= next_rollout:
                    next_rollout += rollout_every
                    r1 = api.post(f"/api/ai/deployments/{DEP}/revisions", json={"engine_args": revision_args})
                    revision_args = [] if revision_args else ["--enforce-eager"]
                    r2 = api.post(f"/api/ai/deployments/{DEP}/rollouts", json={
                        "strategy": "canary", "steps": [{"percent": 50, "secs": 5}, {"percent": 100}],
                        "thresholds": {"error_rate_max": 0.5, "min_requests": 10, "ttft_ms_max": None}})
                    tally.ops.append({"t": round(now), "op": "rollout", "status": [r1.status_code, r2.status_code],
                                      "detail": "" if r2.status_code == 201 else r2.text[:200]})
            except httpx.HTTPError as exc:
                tally.ops.append({"t": round(now), "op": "error", "status": type(exc).__name__})


def _asyncio_tasks(url: str) -> int | None:
    value = scrape_gauge(url, "fabric_process_asyncio_tasks")
    return None if value is None else int(value)


def processes(rig: Rig) -> dict[str, tuple[int, str | None]]:
    """name -> (pid, metrics base URL or None)."""
    out = {f"fabricd-{n}": (p.pid, rig.url(n)) for n, p in rig.fabricd.items()}
    out["agent"] = (rig.agent.pid, f"http://127.0.0.1:{rig.agent_port}")
    out.update({f"gateway-{i}": (g.proc.pid, g.url) for i, g in enumerate(rig.gateways)})
    out.update({f"etcd-{m.name}": (m.proc.pid, None) for m in rig.etcd.members if m.proc is not None})
    return out


def store_size(rig: Rig) -> dict[str, int]:
    m = rig.etcd.members[0]
    req = urllib.request.Request(f"{m.client}/v3/maintenance/status", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        st = json.loads(resp.read())
    keys = len(rig.store.list("/"))
    return {"db_bytes": int(st.get("dbSize", 0)), "db_in_use_bytes": int(st.get("dbSizeInUse", 0)), "keys": keys}


def sample(rig: Rig, tally: Tally, t: float) -> dict:
    procs = {}
    for name, (pid, url) in processes(rig).items():
        procs[name] = {"rss_mb": round(rss_bytes(pid) / 2**20, 1), "fds": open_fds(pid),
                       "asyncio_tasks": _asyncio_tasks(url) if url else None}
        if name.startswith("gateway"):  # where its RSS is: malloc's heaps, pymalloc's arenas, code
            try:
                procs[name]["rss_by_mapping_mb"] = rss_by_mapping(pid)
            except OSError:
                procs[name]["rss_by_mapping_mb"] = None
    calls, errors = tally.take()
    return {"t_s": round(t), "processes": procs, "store": store_size(rig), "calls": calls, "errors": errors}


def heap_reports(rig: Rig) -> None:
    """Ask each gateway for a heap report (FABRIC_GATEWAY_TRACEMALLOC: gateway.heap_profile)."""
    for gw in rig.gateways:
        os.kill(gw.proc.pid, signal.SIGUSR2)


def run(rig: Rig, minutes: float, interval: float = 30.0, scale_every: float = 40.0,
        rollout_every: float = 120.0, log=None, heap: bool = False) -> dict:
    _, key = make_key(rig.store, EP)
    tally, stop = Tally(), threading.Event()
    pauses = {"chat": 0.2, "stream": 0.2, "embeddings": 0.3, "websocket": 1.0}
    threads = [threading.Thread(target=traffic, args=(rig, key, k, tally, stop, pauses[k]), daemon=True)
               for k in KINDS]
    threads.append(threading.Thread(target=operations, args=(rig, tally, stop, scale_every, rollout_every),
                                    daemon=True))
    for th in threads:
        th.start()
    t0 = time.monotonic()
    samples = []
    if heap:
        heap_reports(rig)  # the baseline every later report is compared with
    try:
        while time.monotonic() - t0 < minutes * 60:
            time.sleep(min(interval, max(0.0, minutes * 60 - (time.monotonic() - t0))))
            samples.append(sample(rig, tally, time.monotonic() - t0))
            if heap:
                heap_reports(rig)
            if log:
                log(json.dumps(samples[-1]))
    finally:
        stop.set()
        for th in threads:
            th.join(TIMEOUT_S * 2)
    return {"minutes": minutes, "interval_s": interval, "samples": samples, "operations": tally.ops,
            "summary": summarize(samples)}


def summarize(samples: list[dict]) -> dict:
    """Per process: RSS, fds and tasks at the first and last sample, their max, and the RSS growth
    between the medians of the first and last third (a steady-state slope, not warm-up); errors
    and calls summed by kind."""
    out: dict = {"processes": {}, "calls": Counter(), "errors": Counter()}
    if not samples:
        return out
    third = max(1, len(samples) // 3)
    for name in samples[0]["processes"]:
        series = [s["processes"][name] for s in samples if name in s["processes"]]
        rss = [p["rss_mb"] for p in series]
        tasks = [p["asyncio_tasks"] for p in series if p["asyncio_tasks"] is not None]
        out["processes"][name] = {
            "rss_mb_first": rss[0], "rss_mb_last": rss[-1], "rss_mb_max": max(rss),
            "rss_mb_growth_steady": round(statistics.median(rss[-third:]) - statistics.median(rss[:third]), 1),
            "fds_first": series[0]["fds"], "fds_last": series[-1]["fds"], "fds_max": max(p["fds"] for p in series),
            "asyncio_tasks_first": tasks[0] if tasks else None, "asyncio_tasks_last": tasks[-1] if tasks else None,
            "asyncio_tasks_max": max(tasks) if tasks else None,
        }
    for s in samples:
        out["calls"].update(s["calls"])
        out["errors"].update(s["errors"])
    out["store_first"], out["store_last"] = samples[0]["store"], samples[-1]["store"]
    out["calls"], out["errors"] = dict(out["calls"]), dict(out["errors"])
    total = sum(out["calls"].values())
    out["error_rate"] = round(sum(out["errors"].values()) / total, 5) if total else None
    return out
