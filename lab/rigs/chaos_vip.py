"""The chaos run's VIP side, on the lab only (lab.rigs.chaos_lab): streaming load from the
client namespace straight to the VIP, the flow-table scan injection and the Maglev invariant.

- ``VipLoad``: lab.rigs.vip_stream in the client namespace (new TCP connection per call, so
  every call is a new flow through the XDP Maglev program), its calls read back as they end.
- ``fill_flow_table``: a bounded SYN scan (lab.rigs.syn_scan: one source port per SYN, 4x the
  connection table) into the VIP while one long stream, opened before the scan, is established;
  reports whether that stream finished, the table's fill (entries in the pinned map, read with
  bpftool) and active flows (the agent's API, from the live maps) before, at the peak and after,
  and the seconds until active flows are back to what the load alone keeps.
- ``maglev_ok``: every service in the agent's live maps belongs to an endpoint whose VIP it is,
  its ring (backends with slots) holds only ready replicas of that endpoint's deployment, and every
  endpoint with a VIP and a ready replica has its service with a non-empty ring.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from common import keyspace
from lab.rigs.chaos_rig import wait_until

ROOT = Path(__file__).resolve().parents[2]
VIP_PORT = 8000  # the lab's endpoints serve the engine's port on the VIP


@dataclass
class VipCall:
    start: float
    end: float
    ok: bool
    error: str = ""


def in_client_ns(netns: str, module: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, sys.executable, "-m", module, *args]


@dataclass
class VipLoad:
    """Streaming chat completions to VIP from the client namespace NETNS (WORKERS connections)."""

    netns: str
    vip: str
    model: str
    workers: int = 2
    path: str = "vip"
    calls: list[VipCall] = field(default_factory=list)
    inflight: dict[int, float] = field(default_factory=dict)
    _proc: subprocess.Popen | None = None

    def __enter__(self):
        self._proc = subprocess.Popen(
            in_client_ns(self.netns, "lab.rigs.vip_stream", "--url", f"http://{self.vip}:{VIP_PORT}",
                         "--model", self.model, "--workers", str(self.workers)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "end" in rec:
                self.calls.append(VipCall(rec["start"], rec["end"], rec["ok"], rec["error"]))
                self.inflight.pop(rec["w"], None)
            else:
                self.inflight[rec["w"]] = rec["start"]

    def __exit__(self, *exc):
        self._proc.stdin.close()  # its end: it stops after the calls in flight
        try:
            self._proc.wait(15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def since(self, t: float) -> list[VipCall]:
        return [c for c in list(self.calls) if c.end >= t]


# -- the flow-table scan ----------------------------------------------------------------------


def active_flows(rig) -> int:
    svc = next((s for s in rig.maglev_services() if s["vip"] == rig.vip), None)
    return sum(b.get("active_flows", 0) for b in svc["stats"]) if svc else 0


def table_entries(rig) -> int:
    """Entries in the pinned forward connection table (the LRU keeps ended flows until evicted)."""
    out = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", str(rig.cfg.pin_dir / "flows")],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"bpftool map dump: {out.stderr.strip()}")
    return len(json.loads(out.stdout or "[]"))


def non_syn_misses(rig) -> float:
    """Packets of the VIP's service that were not a SYN and found no flow entry (an evicted flow)."""
    pat = re.compile(r'^fabric_dataplane_flow_misses_total\{(.*)\} (\S+)$')
    total = 0.0
    for line in rig.agent_metrics().splitlines():
        m = pat.match(line)
        if m and f'vip="{rig.vip}"' in m.group(1) and 'kind="non_syn"' in m.group(1):
            total += float(m.group(2))
    return total


def fill_flow_table(rig, factor: int = 4, rate: float = 5000.0) -> dict[str, object]:
    ns = rig.cfg.topology.client_ns
    entries = rig.cfg.flow_entries
    if not entries:
        raise AssertionError("the flow-table scan needs a lab with a small connection table (LabConfig.flow_entries)")
    before = {"table_entries": table_entries(rig), "active_flows": active_flows(rig), "non_syn": non_syn_misses(rig)}
    # one stream that outlives the scan (the lab's engines decode 50 tokens a second)
    long_stream = subprocess.Popen(
        in_client_ns(ns, "lab.rigs.vip_stream", "--url", f"http://{rig.vip}:{VIP_PORT}", "--model", rig.dep,
                     "--once", "--max-tokens", str(int(50 * (factor * entries / rate + 3))), "--timeout", "30"),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    time.sleep(1.0)
    peak = [before["active_flows"]]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak.append(active_flows(rig))
            stop.wait(0.5)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    scan = subprocess.run(in_client_ns(ns, "lab.rigs.syn_scan", "--vip", rig.vip, "--port", str(VIP_PORT),
                                       "--count", str(factor * entries), "--rate", str(rate)),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    scanned = time.monotonic()
    stop.set()
    sampler.join(5)
    if scan.returncode != 0:
        raise RuntimeError(f"syn_scan failed: {scan.stderr.strip()[-500:]}")
    full = table_entries(rig)
    out, _ = long_stream.communicate(timeout=60)
    ended = [json.loads(line) for line in out.splitlines() if '"end"' in line]
    # recovered: active flows back to what the load keeps (its few connections), as before the scan
    back = wait_until(lambda: active_flows(rig) <= before["active_flows"] + 8, 30)
    return {
        "component_recovery_s": None if back is None else round(time.monotonic() - scanned, 2),
        "scan": {
            **json.loads(scan.stdout.strip().splitlines()[-1]),
            "flow_table_size": entries,
            "table_entries_before": before["table_entries"],
            "table_entries_after_scan": full,
            "active_flows_before": before["active_flows"],
            "active_flows_peak": max(peak),
            "active_flows_after": active_flows(rig),
            "non_syn_misses": non_syn_misses(rig) - before["non_syn"],
            "established_stream_ok": bool(ended and ended[-1]["ok"]),
            "established_stream_error": ended[-1]["error"] if ended else "no result",
        },
    }


# -- the Maglev invariant --------------------------------------------------------------------


def maglev_problems(rig) -> list[str]:
    endpoints = [json.loads(kv.value) for kv in rig.store.list(keyspace.endpoints())]
    by_vip = {e["status"]["vip"]: e for e in endpoints if (e.get("status") or {}).get("vip")}
    ready: dict[str, set[str]] = {}
    for kv in rig.store.list(keyspace.replicas()):
        r = json.loads(kv.value)
        if r.get("ready") and r.get("host"):
            ready.setdefault(r["deployment"], set()).add(f"{r['host']}:{r.get('port', VIP_PORT)}")
    problems = []
    try:
        services = rig.maglev_services()
    except httpx.HTTPError as exc:
        return [f"the agent does not answer for its maps: {type(exc).__name__}: {exc}"]
    for svc in services:
        ep = by_vip.get(svc["vip"])
        if ep is None:
            problems.append(f"service {svc['vip']}:{svc['port']} has no endpoint")
            continue
        ring = {b["address"] for b in svc["stats"] if b["slots"]}
        dead = ring - ready.get(ep["deployment"], set())
        if dead:
            problems.append(f"{svc['vip']} ({ep['name']}) ring holds backends that are not ready: {sorted(dead)}")
    served = {s["vip"] for s in services if any(b["slots"] for b in s["stats"])}
    for vip, ep in by_vip.items():
        if ready.get(ep["deployment"]) and vip not in served:
            problems.append(f"endpoint {ep['name']} (VIP {vip}) has ready replicas but no Maglev ring")
    return problems


def maglev_ok(rig, converge_s: float = 15.0) -> bool:
    """The invariant holds within CONVERGE_S (the routing controller pushes every second or two)."""
    last: list[str] = []

    def holds() -> bool:
        last[:] = maglev_problems(rig)
        return not last
    ok = wait_until(holds, converge_s) is not None
    if not ok:
        print(f"maglev invariant: {'; '.join(last)}", file=sys.stderr, flush=True)
    return ok
