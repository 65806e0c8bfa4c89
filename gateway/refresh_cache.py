"""Store reads cached for a short TTL, loaded once however many calls ask at the same moment.

Before this, each cache (keys, endpoint views, model names, the model catalogue) was a dict with an expiry: when an
entry expired, every call in flight that needed it saw the miss and started its own store read
in the thread pool. At 64 clients that was up to 64 identical reads (SQLite, pydantic) once a
second per entry, queued behind each other in the pool while every one of those calls waited:
the gateway's p99 at 64 clients was this stall (hundreds of ms), not the per-call work.

Now, per key:
- loaded less than ``ttl`` ago: the value, no await; once it is past half its ``ttl``, the first
  call also starts one background reload (refresh-ahead), so under steady traffic the value is
  replaced before it expires and no call waits for the store;
- expired or never loaded: the caller waits for the one load in flight (single flight), and its
  error reaches every waiter; a failed background reload leaves the value until its expiry.

A value served is never older than ``ttl`` since its load started (a revoked key is refused
within the TTL, as before), and the store sees about one read per key per half ``ttl`` while
the key is in use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Entry:
    __slots__ = ("expires", "loaded", "loading", "value")

    def __init__(self) -> None:
        self.expires = 0.0
        self.loaded = False
        self.value = None
        self.loading: asyncio.Future | None = None


class RefreshCache(Generic[T]):
    def __init__(self, ttl_secs: float, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic):
        self.ttl_secs = ttl_secs
        self.clock = clock
        self.max_entries = max_entries
        self._entries: dict[object, _Entry] = {}
        self.loads = 0  # store reads started (tests read it)

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: object, load: Callable[[], T]) -> T:
        """The value for key; ``load`` (blocking: it runs in the default thread pool) reads it."""
        entry = self._entries.get(key)
        now = self.clock()
        if entry is not None and entry.loaded and entry.expires > now:
            if entry.loading is None and entry.expires - now < self.ttl_secs / 2:
                self._start(entry, load, now)  # refresh ahead: nobody waits for it
            return entry.value
        if entry is None:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # crude bound: a flood of new keys cannot grow memory
            entry = self._entries[key] = _Entry()
        if entry.loading is None:
            self._start(entry, load, now)
        # shielded: a caller that is cancelled (its client left) must not cancel the shared load
        return await asyncio.shield(entry.loading)

    def _start(self, entry: _Entry, load: Callable[[], T], now: float) -> None:
        self.loads += 1
        loading = asyncio.get_running_loop().run_in_executor(None, load)
        entry.loading = loading

        def done(fut: asyncio.Future) -> None:
            entry.loading = None
            if fut.cancelled() or fut.exception() is not None:
                return  # waiters get the error; a value still fresh stays until it expires
            entry.value, entry.loaded = fut.result(), True
            entry.expires = now + self.ttl_secs  # counted from the load's start: never older than that

        loading.add_done_callback(done)
