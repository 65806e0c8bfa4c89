"""Chaos run: faults injected in turn under steady streaming load, each measured and followed by
invariant checks. Two rigs: the loopback rig (lab.rigs.chaos_rig: load through both gateways)
and the lab (lab.rigs.chaos_lab: load through both gateways and, from the client namespace,
straight through the VIP and the XDP Maglev program; lab.rigs.chaos_vip adds the flow-table
scan and the Maglev invariant there).

For every injection one row: what the clients saw (failed streams, how many, first-to-last
failure span, the error kinds; in total and per path, "gateway" and "vip"), the component's own recovery time (its process answering again,
a new lock holder, a healthy etcd), the time until the client saw successes again, and the
invariants after it:
  reservations  every GPU reservation names a replica that holds that GPU, and the reverse
  vips          every allocated VIP names an endpoint that exists
  maglev        every Maglev service in the agent's live maps names an endpoint that has it as its VIP,
                its ring holds only ready replicas, and every served endpoint has one (n/a without
                dataplane)
  limits        a fresh key with a quota of 6, hit 12 times over both gateways: exactly 6 admitted
  audit         the gateways' audit hash chain verifies

``run(rig, names, settle_s)`` returns the rows; scripts/chaos prints them as JSON. A rig gives:
dep/ep/node, api(), leader(), kill_fabricd/start_fabricd, kill_agent/start_agent/agent_up,
kill_gateway/restart_gateway, chat_urls(), gateway_verify, new_key(), ready_replicas(), etcd,
store, and ``vip`` (empty: no dataplane).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import httpx

from common import audit_chain, keyspace
from lab.rigs.chaos_rig import wait_until
from lab.rigs.chaos_vip import VipLoad, fill_flow_table, maglev_ok
from lab.rigs.vip_stream import stream_once as _stream

CLIENT_TIMEOUT_S = 5.0


@dataclass
class Call:
    start: float
    end: float
    ok: bool
    error: str = ""


@dataclass
class StreamLoad:
    """WORKERS threads, each streaming chat completions through the gateways (URLS) in turn."""

    urls: list[str]
    model: str
    key: str
    verify: object = True
    workers: int = 3
    path: str = "gateway"
    calls: list[Call] = field(default_factory=list)
    inflight: dict[int, float] = field(default_factory=dict)  # worker -> start of its open call
    stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self):
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(self.workers)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self._threads:
            t.join(CLIENT_TIMEOUT_S * 3)

    def _work(self, worker: int) -> None:
        body = {"model": self.model, "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=CLIENT_TIMEOUT_S, headers=headers, verify=self.verify) as http:
            i = worker
            while not self.stop.is_set():
                url = self.urls[i % len(self.urls)]
                i += 1
                t0 = self.inflight[worker] = time.monotonic()
                ok, error = _stream(http, url, body)
                self.calls.append(Call(t0, time.monotonic(), ok, error))
                self.inflight.pop(worker, None)
                if not ok:
                    time.sleep(0.1)

    def since(self, t: float) -> list[Call]:
        return [c for c in list(self.calls) if c.end >= t]


# -- injections: each does its fault and its repair, returns the component's recovery seconds --


def kill_agent(rig) -> float | None:
    rig.kill_agent()
    time.sleep(1.0)  # a supervisor's restart delay
    restarted = time.time()
    rig.start_agent("ab")
    with rig.api() as api:
        took = wait_until(lambda: rig.agent_up() and
                          api.get(f"/api/ai/nodes/{rig.node}").json().get("last_heartbeat", 0) > restarted, 180)
    return None if took is None else round(took + 1.0, 2)


def kill_fabricd_leader(rig) -> float | None:
    wait_until(lambda: rig.leader() is not None, 30)  # an earlier step may have left it in transition
    leader = rig.leader()
    survivor = "b" if leader == "a" else "a"
    rig.kill_fabricd(leader)
    took = wait_until(lambda: rig.leader() == survivor, 30)
    rig.start_fabricd(leader, "ab", wait=False)  # the pair becomes whole again in the background
    return took


def kill_gateway(rig) -> float | None:
    rig.kill_gateway(0)
    time.sleep(1.0)
    t = time.monotonic()
    rig.restart_gateway(0)
    return round(time.monotonic() - t + 1.0, 2)


def _engine(rig) -> str:
    with rig.api() as api:
        rep = min(rig.ready_replicas(api), key=lambda r: r["replica_id"])
    return f"http://{rep['host']}:{rep['port']}"


def stall_engine(rig, hold_s: float = 3.0) -> float | None:
    engine = _engine(rig)
    httpx.post(f"{engine}/sim/faults", json={"added_latency_ms": 60_000}, timeout=5).raise_for_status()
    time.sleep(hold_s)
    httpx.post(f"{engine}/sim/faults", json={"added_latency_ms": 0}, timeout=5).raise_for_status()
    return 0.0


def fail_engine_health(rig) -> float | None:
    """The engine's /health answers 503: the replica leaves the ready set and the controllers
    replace it; recovery is as many Ready replicas as before, the failed engine not among them."""
    engine = _engine(rig)
    with rig.api() as api:
        wanted = len(rig.ready_replicas(api))
    t = time.monotonic()
    httpx.post(f"{engine}/sim/faults", json={"fail_health": True}, timeout=5).raise_for_status()
    with rig.api() as api:
        def replaced() -> bool:
            ready = rig.ready_replicas(api)
            return len(ready) == wanted and all(f"http://{r['host']}:{r['port']}" != engine for r in ready)
        took = wait_until(replaced, 60)
    try:  # if it was not replaced, give the engine its health back so the next step starts clean
        httpx.post(f"{engine}/sim/faults", json={"fail_health": False}, timeout=5)
    except httpx.TransportError:
        pass
    return None if took is None else round(time.monotonic() - t, 2)


def drop_etcd_leader(rig, hold_s: float = 2.0) -> float | None:
    leader = rig.etcd.leader()
    t = time.monotonic()
    rig.etcd.kill(leader)
    elected = wait_until(lambda: rig.etcd.leader() is not None, 20)
    time.sleep(hold_s)
    rig.etcd.restart(leader)
    rig.etcd.wait_healthy(30)
    return elected if elected is not None else round(time.monotonic() - t, 2)


INJECTIONS = {
    "agent_sigkill": kill_agent,
    "fabricd_leader_sigkill": kill_fabricd_leader,
    "gateway_sigkill": kill_gateway,
    "engine_stall": stall_engine,
    "engine_health_fail": fail_engine_health,
    "etcd_leader_drop": drop_etcd_leader,
    "flow_table_scan": fill_flow_table,  # the lab only: it needs the XDP dataplane
}
NEEDS_DATAPLANE = {"flow_table_scan"}


# -- invariants ---------------------------------------------------------------------------


def invariants(rig) -> dict[str, object]:
    store = rig.store
    replicas = {json.loads(kv.value)["replica_id"]: json.loads(kv.value) for kv in store.list(keyspace.replicas())}
    held = {f"{r['node']}/{g}": rid for rid, r in replicas.items() for g in r.get("gpus", [])}
    prefix = keyspace.gpu_reservations()
    reserved = {kv.key[len(prefix):]: json.loads(kv.value)["replica_id"] for kv in store.list(prefix)}
    endpoints = {kv.key[len(keyspace.endpoints()):] for kv in store.list(keyspace.endpoints())}
    vprefix = keyspace.vips()
    vips = {kv.key[len(vprefix):]: json.loads(kv.value)["endpoint"] for kv in store.list(vprefix)}
    return {
        "reservations": reserved == held,
        "vips": all(ep in endpoints for ep in vips.values()) and len(set(vips.values())) == len(vips),
        "maglev": maglev_ok(rig) if rig.vip else "n/a (loopback rig: no dataplane)",
        "limits": limits_exact(rig),
        "audit": audit_ok(rig),
    }


def limits_exact(rig, quota: int = 6) -> bool:
    key = rig.new_key(request_quota=quota)
    body = {"model": rig.dep, "max_tokens": 1, "messages": [{"role": "user", "content": "q"}]}
    urls = rig.chat_urls()

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {key}"},
                                     verify=rig.gateway_verify) as http:
            return await asyncio.gather(*(http.post(urls[i % len(urls)], json=body) for i in range(2 * quota)))

    codes = [r.status_code for r in asyncio.run(burst())]
    return codes.count(200) == quota and codes.count(429) == quota


def audit_ok(rig) -> bool:
    # rows are appended in batches: give the gateways a moment to flush before verifying
    return wait_until(lambda: audit_chain.verify(rig.store).ok, 10) is not None


# -- the run ------------------------------------------------------------------------------


def measure(loads: list, t_inject: float, settle_s: float) -> dict[str, object]:
    """Client view since T_INJECT over every load (each has .path, .inflight and .since(t)). Waits
    (at most 30 s) until every call open when the injection ended has finished and, on each path,
    SETTLE_S of unbroken successes followed its last failure. The totals, then per path."""
    t_end = time.monotonic()

    def path_settled(load) -> bool:
        if any(start < t_end for start in list(load.inflight.values())):
            return False
        calls = load.since(t_inject)
        last_fail = max((c.end for c in calls if not c.ok), default=t_inject)
        return any(c.ok and c.start >= last_fail for c in calls) and time.monotonic() - last_fail >= settle_s
    wait_until(lambda: all(path_settled(load) for load in loads), 30)
    by_path = {load.path: summarize(load.since(t_inject), t_inject) for load in loads}
    total = summarize([c for load in loads for c in load.since(t_inject)], t_inject)
    return {**total, "paths": by_path} if len(loads) > 1 else total


def summarize(calls: list, t_inject: float) -> dict[str, object]:
    failed = [c for c in calls if not c.ok]
    oks_after = [c.end for c in calls if c.ok and (not failed or c.start >= max(f.end for f in failed))]
    kinds: dict[str, int] = {}
    for c in failed:
        kinds[c.error] = kinds.get(c.error, 0) + 1
    return {
        "client_calls": len(calls),
        "client_errors": len(failed),
        "client_error_kinds": kinds,
        "client_error_span_s": round(max(c.end for c in failed) - min(c.start for c in failed), 2) if failed else 0.0,
        # None: the client never saw a success after its last failure within the wait
        "client_recovery_s": (round(min(oks_after) - t_inject, 2) if oks_after else None) if failed else 0.0,
    }


def run(rig, names: list[str], settle_s: float = 2.0) -> list[dict[str, object]]:
    """Every injection in NAMES in turn under load through the gateways and, when the rig has a
    VIP with a dataplane behind it, straight through the VIP from the client namespace."""
    key = rig.new_key()
    rows = []
    with ExitStack() as stack:
        loads = [stack.enter_context(StreamLoad(rig.chat_urls(), rig.dep, key, rig.gateway_verify))]
        if rig.vip:
            loads.append(stack.enter_context(VipLoad(rig.cfg.topology.client_ns, rig.vip, rig.dep)))
        time.sleep(1.0)
        for name in names:
            t = time.monotonic()
            row: dict[str, object] = {"injection": name}
            try:
                component = INJECTIONS[name](rig)
            except Exception as exc:  # noqa: BLE001 - a step that broke is a row that says so; go on
                component, row["injection_error"] = None, f"{type(exc).__name__}: {exc}"[:500]
            if isinstance(component, dict):  # an injection that reports more than one figure
                row.update(component)
            else:
                row["component_recovery_s"] = component
            row.update(measure(loads, t, settle_s))
            row["invariants"] = invariants(rig)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows
