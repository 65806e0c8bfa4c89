"""In-flight slots held under a store lease per gateway process, so a dead gateway gives them back.

Each gateway process is a *holder*: ``counters/holders/{holder}`` lives under a lease of
FABRIC_GATEWAY_SLOT_LEASE_SECS that a background task renews every third of it. Held counters
(``counters/slots/...``, common.records.counters.held_reserve) count each holder's slots separately and
add up only live holders, so a SIGKILLed process's slots stop counting once its lease expires.
A live holder is never mistaken for a dead one: a holder missing from the cached set of live
holders (refreshed every second) is looked up directly before its slots are dropped; a dead one
still in the cache counts for at most a second longer (refusing more, never admitting more).

If this process's own lease expires (the process stalled past the TTL), it takes a new lease and
re-registers under the same name; slots other processes pruned meanwhile are not counted until
released, which can admit up to that many extra calls once. A sweep every lease TTL drops dead
holders' entries from counters nobody touches, so those keys disappear too.

`fabric-gateway slots` prints the view that ``slot_view()`` returns.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field

from common.errors import NotFound, TransientError
from common.records import counters
from common.store.base import Store

log = logging.getLogger("fabric.gateway.slots")
LIVE_CACHE_SECS = 1.0


def holder_name(gateway_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._:-]", "_", gateway_id)[:64]
    return f"{safe}-{os.getpid()}-{os.urandom(3).hex()}"


@dataclass
class SlotHolder:
    store: Store
    gateway_id: str
    lease_secs: int = 10
    name: str = ""
    _lease: int | None = None
    _live: frozenset[str] = frozenset()
    _live_at: float = -1e9
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _task: asyncio.Task | None = None

    def __post_init__(self) -> None:
        self.name = self.name or holder_name(self.gateway_id)

    # --- the lease (blocking; called from threads or at start) -----------------------------------
    def register(self) -> None:
        with self._lock:
            self._lease = counters.register_holder(
                self.store, self.name, {"gateway_id": self.gateway_id, "pid": os.getpid(), "since": round(time.time())},
                self.lease_secs)

    def renew(self) -> None:
        if self._lease is None or not self.store.refresh_lease(self._lease):
            log.warning("slot lease of %s had expired; registering again", self.name)
            self.register()

    def revoke(self) -> None:
        if self._lease is not None:
            try:
                self.store.revoke_lease(self._lease)
            except (NotFound, TransientError):
                pass
            self._lease = None

    # --- liveness ----------------------------------------------------------------------------------
    def is_live(self, holder: str) -> bool:
        if holder == self.name:
            return True
        self._refresh_live()
        if holder in self._live:
            return True
        alive = counters.holder_alive(self.store, holder)  # registered after our listing?
        if alive:
            self._live = self._live | {holder}
        return alive

    def live_count(self) -> int:
        """How many gateway processes hold a live lease (this one counts even before it registered);
        from the listing is_live keeps, so at most one store read a second (gateway.bands' share)."""
        self._refresh_live()
        return len(self._live | {self.name})

    async def live_count_async(self) -> int:
        if time.monotonic() - self._live_at <= LIVE_CACHE_SECS:
            return len(self._live | {self.name})
        return await asyncio.to_thread(self.live_count)

    def _refresh_live(self) -> None:
        now = time.monotonic()
        if now - self._live_at > LIVE_CACHE_SECS:
            self._live = counters.live_holders(self.store)
            self._live_at = now

    def change(self, key: str, amount: int, limit: int | None) -> counters.Outcome:
        return counters.held_reserve(self.store, key, self.name, amount, limit, self.is_live)

    def sweep(self) -> int:
        """Drop dead holders' slots from every held counter; returns how many keys changed."""
        changed = 0
        for name, held in counters.held_counters(self.store):
            if any(not self.is_live(h) for h in held):
                counters.held_reserve(self.store, counters.held_key(name), self.name, 0, None, self.is_live)
                changed += 1
        return changed

    # --- the background task -----------------------------------------------------------------------
    def start_renewing(self) -> None:
        """After register() (before serving: no slot is taken by an unregistered holder)."""
        self._task = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _renew_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(self.lease_secs / 3)
            ticks += 1
            try:
                await asyncio.to_thread(self.renew)
                if ticks % 3 == 0:
                    await asyncio.to_thread(self.sweep)
            except Exception:
                log.exception("slot lease renewal failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await asyncio.to_thread(self.revoke)


def slot_view(store: Store) -> dict:
    """Every held counter with its holders, and which holders are alive (the `slots` command)."""
    live = counters.live_holders(store)
    slots = []
    for name, held in counters.held_counters(store):
        slots.append({
            "counter": name,
            "in_flight": sum(n for h, n in held.items() if h in live),
            "holders": {h: {"slots": n, "alive": h in live} for h, n in sorted(held.items())},
        })
    return {"holders": sorted(live), "counters": slots}
