"""A background writer that takes items from the request path for the price of a deque append.

The hot path only appends (no lock, no condition variable, no thread wake-up per call); one
thread wakes every ``interval`` seconds, takes everything queued (up to ``batch`` items at a
time) and hands it to ``apply`` in order; it drains again at once only after a full batch. Profiling at 64 clients showed a queue.Queue per
writer waking its thread on every put (Condition.notify/wait) costing more than the writes it
batched. ``flush()`` waits until every item added before it was applied (tests, shutdown);
``close()`` applies what is left and stops the thread. An exception from ``apply`` is logged
and the batch dropped (the store may be down; the calls already finished). With ``max_pending``
the queue is bounded: an item added to a full queue is dropped. Nothing is dropped silently:
every dropped item is counted in ``dropped`` and reported to ``on_drop(reason, n)`` (reason
"queue_full" or "write_failed"), which the gateway turns into a metric.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("fabric.gateway.writer")


class BatchWriter:
    def __init__(self, apply: Callable[[list], None], *, name: str, interval: float = 0.01, batch: int = 512,
                 max_pending: int | None = None, on_drop: Callable[[str, int], None] | None = None):
        self._apply = apply
        self._max_pending = max_pending
        self._on_drop = on_drop
        self.dropped = 0
        self._interval = interval
        self._batch = batch
        self._items: deque = deque()
        self._added = 0  # items added (only the request thread writes it)
        self._done = 0  # items applied or dropped (only the writer thread writes it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, item) -> bool:
        """Queue ``item``; False when the queue is full and it was dropped (and counted)."""
        if self._max_pending is not None and len(self._items) >= self._max_pending:
            self._drop("queue_full", 1)
            return False
        self._items.append(item)
        self._added += 1
        return True

    def _drop(self, reason: str, n: int) -> None:
        self.dropped += n
        if self._on_drop is not None:
            try:
                self._on_drop(reason, n)
            except Exception:
                log.exception("%s: could not report %d dropped items", self._thread.name, n)

    def _drain(self) -> int:
        """Apply up to ``batch`` queued items; returns how many were taken."""
        if not self._items:
            return 0
        n = min(len(self._items), self._batch)
        items = [self._items.popleft() for _ in range(n)]
        try:
            self._apply(items)
        except Exception:
            log.exception("%s: %d items could not be written", self._thread.name, len(items))
            self._drop("write_failed", n)
        finally:
            self._done += n
        return n

    def _run(self) -> None:
        # The thread sleeps the interval after every batch that was not full, not only when the
        # queue is empty: draining again at once under load made a small batch (and a store
        # transaction, with its GIL hand-offs to and from the event loop) every few calls.
        while not self._stop.is_set():
            if self._drain() < self._batch:
                self._stop.wait(self._interval)
        while self._drain():
            pass

    @property
    def pending(self) -> bool:
        return bool(self._items)

    def flush(self, timeout: float = 30.0) -> None:
        target, deadline = self._added, time.monotonic() + timeout
        while self._done < target and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.002)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
