"""Long-poll watches (GET /api/ai/watch/{family}) on threads of their own, capped.

A watch blocks in the store for up to 60 s. It used to do so in the thread pool that serves
every synchronous route, so 45 open watches (any viewer may open them) pushed /healthz and node
heartbeats to 20 s. Now the route is async and awaits the store's watch on this gate's own
executor; at most PER_CALLER watches are open per caller (its token's subject) and TOTAL in
all, one more is 429 ("too_many_watches" for the caller's own cap, "watches_full" for the
total) with Retry-After, so a watcher's client retries after a moment.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from common.errors import LimitExceeded

TOTAL = 32
PER_CALLER = 4

T = TypeVar("T")


class WatchGate:
    def __init__(self, total: int = TOTAL, per_caller: int = PER_CALLER):
        self.total, self.per_caller = total, per_caller
        self._pool = ThreadPoolExecutor(max_workers=total, thread_name_prefix="fabricd-watch")
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def open(self) -> int:
        return sum(self._open.values())

    def _take(self, caller: str) -> None:
        with self._lock:
            if self._open.get(caller, 0) >= self.per_caller:
                raise LimitExceeded(f"you have {self.per_caller} watches open already; close one or wait",
                                    retry_after=1.0, code="too_many_watches")
            if sum(self._open.values()) >= self.total:
                raise LimitExceeded(f"fabricd holds its limit of {self.total} open watches; try again shortly",
                                    retry_after=1.0, code="watches_full")
            self._open[caller] = self._open.get(caller, 0) + 1

    def _give(self, caller: str) -> None:
        with self._lock:
            left = self._open.get(caller, 0) - 1
            if left > 0:
                self._open[caller] = left
            else:
                self._open.pop(caller, None)

    async def run(self, caller: str, fn: Callable[[], T]) -> T:
        """``fn()`` on the gate's executor, holding one of the caller's watch slots meanwhile."""
        self._take(caller)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        finally:
            self._give(caller)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
