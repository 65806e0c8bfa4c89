"""LoRA adapters on vLLM replicas, loaded on demand through vLLM's runtime LoRA API.

A model's ``adapters`` are model names for clients and keys. A call for one goes to a replica of
the endpoint's (chosen) pool by plan_adapter (pure):

1. a replica that holds it and is not saturated (fewest calls in flight);
2. else a replica that is not saturated and has room (fewer than ``max_loaded_adapters``): load;
3. else a replica that is not saturated and holds an idle adapter (no call in flight here):
   unload its least recently used idle adapter, then load;
4. else, every replica saturated or busy: one that holds it anyway, else step 2 or 3 over all
   replicas; else 503 ``adapter_capacity``.

What each replica holds is this gateway process's record of its own loads and unloads. A load
the engine refuses because it is full (another gateway or worker loaded more) makes the gateway
re-read the replica's ``GET /v1/models`` (vLLM lists loaded adapters with a ``parent``) and try
the plan once more; "already loaded" counts as loaded. Loads and unloads of one replica are
serialised. lora_path is ``/adapters/{name}`` (where the replica sees the adapter's files).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from common.errors import FabricError
from common.http1_client import UpstreamError, UpstreamPool
from gateway.proxy import ProxyResult, open_response, relay, split_target

ADAPTER_ROOT = "/adapters"


class AdapterUnavailable(FabricError):
    status = 503
    code = "adapter_capacity"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = 1.0


@dataclass(frozen=True)
class AdapterPlan:
    replica: str
    load: bool = False
    unload: str | None = None
    reason: str = ""


def plan_adapter(replicas: Sequence[str], adapter: str, held: dict[str, list[str]], busy: set[tuple[str, str]],
                 in_flight: dict[str, int], saturated: set[str], cap: int) -> AdapterPlan | None:
    """Pure. held: replica -> adapters, least recently used first; busy: (replica, adapter) with
    calls in flight. None: no replica can take it."""
    def load_where(candidates: list[str]) -> AdapterPlan | None:
        roomy = [r for r in candidates if len(held.get(r, [])) < cap]
        if roomy:
            r = min(roomy, key=lambda r: (len(held.get(r, [])), in_flight.get(r, 0)))
            return AdapterPlan(r, load=True, reason="loaded on a replica with room")
        for r in sorted(candidates, key=lambda r: in_flight.get(r, 0)):
            idle = [a for a in held.get(r, []) if (r, a) not in busy]
            if idle:
                return AdapterPlan(r, load=True, unload=idle[0], reason=f"unloaded idle {idle[0]} (least recent)")
        return None

    holding = [r for r in replicas if adapter in held.get(r, [])]
    free = [r for r in replicas if r not in saturated]
    ready = [r for r in holding if r not in saturated]
    if ready:
        return AdapterPlan(min(ready, key=lambda r: in_flight.get(r, 0)), reason="holds the adapter")
    plan = load_where(free)
    if plan is not None:
        return plan
    if holding:
        return AdapterPlan(min(holding, key=lambda r: in_flight.get(r, 0)), reason="holds the adapter (saturated)")
    return load_where(list(replicas))


@dataclass
class AdapterRouter:
    """Per gateway process: what each replica holds (LRU order), calls in flight per adapter."""

    _held: dict[str, OrderedDict[str, float]] = field(default_factory=dict)
    _busy: dict[tuple[str, str], int] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def held(self) -> dict[str, list[str]]:
        return {r: list(h) for r, h in self._held.items()}

    async def place(self, pool: UpstreamPool, replicas: dict[str, str], adapter: str, cap: int,
                    saturated: set[str], in_flight: dict[str, int]) -> tuple[str, dict]:
        """replicas: id -> base URL. Returns (replica id, explanation); loads/unloads as planned."""
        for attempt in (0, 1):
            plan = plan_adapter(sorted(replicas), adapter, self.held(), set(self._busy), in_flight, saturated, cap)
            if plan is None:
                raise AdapterUnavailable(f"every replica holds {cap} adapters in use; retry shortly")
            why = {"mode": "adapter", "adapter": adapter, "reason": plan.reason, "chosen": plan.replica,
                   "held": self.held().get(plan.replica, [])}
            if not plan.load:
                self._touch(plan.replica, adapter)
                return plan.replica, why
            lock = self._locks.setdefault(plan.replica, asyncio.Lock())
            async with lock:
                if adapter in self._held.get(plan.replica, {}):  # loaded meanwhile
                    self._touch(plan.replica, adapter)
                    return plan.replica, why
                base = replicas[plan.replica]
                if plan.unload is not None and (plan.replica, plan.unload) not in self._busy:
                    await _post(pool, base, b"/v1/unload_lora_adapter", {"lora_name": plan.unload})
                    self._held.get(plan.replica, OrderedDict()).pop(plan.unload, None)
                    why["unloaded"] = plan.unload
                status, text = await _post(pool, base, b"/v1/load_lora_adapter",
                                           {"lora_name": adapter, "lora_path": f"{ADAPTER_ROOT}/{adapter}"})
                if status < 300 or "already been loaded" in text:
                    self._touch(plan.replica, adapter)
                    why["loaded"] = True
                    return plan.replica, why
                if attempt == 0:  # the engine knows better: re-read what it holds, plan again
                    self._held[plan.replica] = OrderedDict((a, 0.0) for a in await _loaded(pool, base))
                    continue
                raise AdapterUnavailable(f"the replica refused to load adapter {adapter!r} ({status})",
                                         code="adapter_load_failed")
        raise AdapterUnavailable("no replica could load the adapter")

    async def forward(self, pool: UpstreamPool, send, urls: dict[str, str], replica: str, adapter: str,
                      place_again, method: str, target: bytes, headers: list, body: bytes, streaming: bool,
                      extra: list, why: dict) -> ProxyResult:
        """Proxy the call to the replica; when it answers 404 (the adapter was unloaded behind this
        gateway's back: another gateway or worker made room), forget it there, place it again
        (``place_again()``: loads it) and retry once, before any byte reached the client."""
        t0 = time.perf_counter()
        self.started(replica, adapter)
        try:
            resp = await open_response(pool, [urls[replica]], method, target, headers, body, streaming)
            if resp.status == 404:
                resp.close()
                self.finished(replica, adapter)
                self._held.get(replica, OrderedDict()).pop(adapter, None)
                replica, again = await place_again()
                self.started(replica, adapter)
                why.update(again, reloaded=True)
                resp = await open_response(pool, [urls[replica]], method, target, headers, body, streaming)
            return await relay(resp, send, t0, extra)
        finally:
            self.finished(replica, adapter)

    def _touch(self, replica: str, adapter: str) -> None:
        h = self._held.setdefault(replica, OrderedDict())
        h[adapter] = time.monotonic()
        h.move_to_end(adapter)

    def started(self, replica: str, adapter: str) -> None:
        self._busy[(replica, adapter)] = self._busy.get((replica, adapter), 0) + 1

    def finished(self, replica: str, adapter: str) -> None:
        left = self._busy.get((replica, adapter), 0) - 1
        if left > 0:
            self._busy[(replica, adapter)] = left
        else:
            self._busy.pop((replica, adapter), None)
        self._touch(replica, adapter)  # idle from now: least recently used counts from here


async def _call(pool: UpstreamPool, base: str, method: str, path: bytes, headers: list, body: bytes,
                limit: int = 1024 * 1024) -> tuple[int, bytes]:
    """One small control call to a replica, its whole answer read (at most ``limit`` bytes)."""
    scheme, host, port = split_target(base)
    resp = await pool.request(scheme, host, port, method, path, headers, body)
    try:
        out = bytearray()
        while (chunk := await resp.next_chunk()) is not None and len(out) <= limit:
            out += chunk
            if resp.at_end:
                break
        return resp.status, bytes(out[:limit])
    finally:
        resp.close()


async def _post(pool: UpstreamPool, base: str, path: bytes, body: dict) -> tuple[int, str]:
    raw = json.dumps(body).encode()
    try:
        status, text = await _call(pool, base, "POST", path, [(b"content-type", b"application/json")], raw)
        return status, text[:4096].decode(errors="replace")
    except UpstreamError:
        raise AdapterUnavailable("could not reach the replica to load the adapter",
                                 code="adapter_load_failed") from None


async def _loaded(pool: UpstreamPool, base: str) -> list[str]:
    try:
        _, raw = await _call(pool, base, "GET", b"/v1/models", [], b"")
        cards = json.loads(raw).get("data", [])
        return [c["id"] for c in cards if isinstance(c, dict) and c.get("parent")]
    except (UpstreamError, ValueError, AttributeError, KeyError, TypeError):
        return []
