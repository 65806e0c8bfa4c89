"""Chaos run on the loopback rig (tests.support.chaos_rig): faults injected in turn under steady
streaming load through both gateways, each measured and followed by invariant checks.

For every injection one row: what the client saw (failed streams, how many, first-to-last
failure span, the error kinds), the component's own recovery time (its process answering again,
a new lock holder, a healthy etcd), the time until the client saw successes again, and the
invariants after it:
  reservations  every GPU reservation names a replica that holds that GPU, and the reverse
  vips          every allocated VIP names an endpoint that exists
  maglev        every Maglev service the agent programs names an endpoint (n/a without dataplane)
  limits        a fresh key with a quota of 6, hit 12 times over both gateways: exactly 6 admitted
  audit         the gateways' audit hash chain verifies

``run(rig, names, hold_s)`` returns the rows; scripts/chaos prints them as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from common import audit_chain, keyspace
from tests.gateway.gateway_harness import make_key
from tests.support.chaos_rig import DEP, EP, NODE, Rig, wait_until

CLIENT_TIMEOUT_S = 5.0


@dataclass
class Call:
    start: float
    end: float
    ok: bool
    error: str = ""


@dataclass
class StreamLoad:
    """WORKERS threads, each streaming chat completions through the gateways in turn."""

    rig: Rig
    key: str
    workers: int = 3
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
        body = {"model": DEP, "stream": True, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=CLIENT_TIMEOUT_S, headers=headers) as http:
            i = worker
            while not self.stop.is_set():
                gw = self.rig.gateways[i % len(self.rig.gateways)]
                i += 1
                t0 = self.inflight[worker] = time.monotonic()
                ok, error = _stream(http, gw.openai_base(EP) + "/chat/completions", body)
                self.calls.append(Call(t0, time.monotonic(), ok, error))
                self.inflight.pop(worker, None)
                if not ok:
                    time.sleep(0.1)

    def since(self, t: float) -> list[Call]:
        return [c for c in list(self.calls) if c.end >= t]


def _stream(http: httpx.Client, url: str, body: dict) -> tuple[bool, str]:
    try:
        with http.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                return False, f"http {r.status_code}"
            text = "".join(r.iter_text())
            return ("data: [DONE]" in text), ("" if "data: [DONE]" in text else "stream cut")
    except httpx.TimeoutException:
        return False, "timeout"
    except httpx.TransportError as exc:
        return False, type(exc).__name__


# -- injections: each does its fault and its repair, returns the component's recovery seconds --


def kill_agent(rig: Rig) -> float | None:
    rig.agent.kill()
    rig.agent.wait(10)
    time.sleep(1.0)  # a supervisor's restart delay
    rig.start_agent("ab")
    with rig.api("b") as api:
        took = wait_until(lambda: rig.agent_up() and
                          api.get(f"/api/ai/nodes/{NODE}").json().get("last_heartbeat", 0) > time.time() - 1.5, 30)
    return None if took is None else round(took + 1.0, 2)


def kill_fabricd_leader(rig: Rig) -> float | None:
    wait_until(lambda: rig.leader() is not None, 30)  # an earlier step may have left it in transition
    leader = rig.leader()
    survivor = "b" if leader == "a" else "a"
    rig.kill_fabricd(leader)
    took = wait_until(lambda: rig.leader() == survivor, 30)
    rig.start_fabricd(leader, "ab", wait=False)  # the pair becomes whole again in the background
    return took


def kill_gateway(rig: Rig) -> float | None:
    rig.gateways[0].proc.kill()
    rig.gateways[0].proc.wait(10)
    time.sleep(1.0)
    t = time.monotonic()
    rig.restart_gateway(0)
    return round(time.monotonic() - t + 1.0, 2)


def _engine(rig: Rig) -> str:
    with rig.api() as api:
        rep = min(rig.ready_replicas(api), key=lambda r: r["replica_id"])
    return f"http://{rep['host']}:{rep['port']}"


def stall_engine(rig: Rig, hold_s: float = 3.0) -> float | None:
    engine = _engine(rig)
    httpx.post(f"{engine}/sim/faults", json={"added_latency_ms": 60_000}, timeout=5).raise_for_status()
    time.sleep(hold_s)
    httpx.post(f"{engine}/sim/faults", json={"added_latency_ms": 0}, timeout=5).raise_for_status()
    return 0.0


def fail_engine_health(rig: Rig) -> float | None:
    """The engine's /health answers 503: the replica leaves the ready set and the controllers
    replace it; recovery is two Ready replicas again, the failed engine not among them."""
    engine = _engine(rig)
    t = time.monotonic()
    httpx.post(f"{engine}/sim/faults", json={"fail_health": True}, timeout=5).raise_for_status()
    with rig.api() as api:
        def replaced() -> bool:
            ready = rig.ready_replicas(api)
            return len(ready) == 2 and all(f"http://{r['host']}:{r['port']}" != engine for r in ready)
        took = wait_until(replaced, 60)
    try:  # if it was not replaced, give the engine its health back so the next step starts clean
        httpx.post(f"{engine}/sim/faults", json={"fail_health": False}, timeout=5)
    except httpx.TransportError:
        pass
    return None if took is None else round(time.monotonic() - t, 2)


def drop_etcd_leader(rig: Rig, hold_s: float = 2.0) -> float | None:
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
}


# -- invariants ---------------------------------------------------------------------------


def invariants(rig: Rig) -> dict[str, object]:
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
        "maglev": "n/a (loopback rig: no dataplane)",
        "limits": limits_exact(rig),
        "audit": audit_ok(rig),
    }


def limits_exact(rig: Rig, quota: int = 6) -> bool:
    _, key = make_key(rig.store, EP, request_quota=quota)
    body = {"model": DEP, "max_tokens": 1, "messages": [{"role": "user", "content": "q"}]}

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {key}"}) as http:
            return await asyncio.gather(*(http.post(rig.gateways[i % 2].openai_base(EP) + "/chat/completions",
                                                    json=body) for i in range(2 * quota)))

    codes = [r.status_code for r in asyncio.run(burst())]
    return codes.count(200) == quota and codes.count(429) == quota


def audit_ok(rig: Rig) -> bool:
    # rows are appended in batches: give the gateways a moment to flush before verifying
    return wait_until(lambda: audit_chain.verify(rig.store).ok, 10) is not None


# -- the run ------------------------------------------------------------------------------


def measure(load: StreamLoad, t_inject: float, settle_s: float) -> dict[str, object]:
    """Client view since T_INJECT. Waits (at most 30 s) until every call open when the injection
    ended has finished and SETTLE_S of unbroken successes followed the last failure."""
    t_end = time.monotonic()

    def settled() -> bool:
        if any(start < t_end for start in list(load.inflight.values())):
            return False
        calls = load.since(t_inject)
        failed = [c for c in calls if not c.ok]
        last_fail = max((c.end for c in failed), default=t_inject)
        return any(c.ok and c.start >= last_fail for c in calls) and time.monotonic() - last_fail >= settle_s
    wait_until(settled, 30)
    calls = load.since(t_inject)
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


def run(rig: Rig, names: list[str], settle_s: float = 2.0) -> list[dict[str, object]]:
    _, key = make_key(rig.store, EP)
    rows = []
    with StreamLoad(rig, key) as load:
        time.sleep(1.0)
        for name in names:
            t = time.monotonic()
            component = INJECTIONS[name](rig)
            row: dict[str, object] = {"injection": name, "component_recovery_s": component}
            row.update(measure(load, t, settle_s))
            row["invariants"] = invariants(rig)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows
