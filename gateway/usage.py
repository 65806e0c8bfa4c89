"""Counting every key's requests (fabricctl's USED column) without a store write on the hot path.

A key WITH a request quota is counted by its exact reservation (gateway.limits): admission must
see the count. A key without one only needs the number to be right soon after, so the call only
enqueues its key id; one background thread drains the queue, adds the counts up per key and
applies each key's total with one compare-and-swap (common.counters.reserve, no limit). Measured
at 64 clients, a synchronous reservation per call doubled the gateway's CPU per call (a SQLite
transaction plus a thread hop); this costs a queue put. Counts still queued when a gateway is
killed with SIGKILL are lost (at most a few milliseconds' worth); a clean stop flushes them.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter

from common import counters, keyspace
from common.store.base import Store

log = logging.getLogger("fabric.gateway.usage")
_STOP = object()
BATCH = 1024


def usage_key(key_id: str) -> str:
    """The same counter the request quota reserves on (one number per key)."""
    return keyspace.counters(f"quota/{key_id}")


class UsageCounter:
    def __init__(self, store: Store):
        self._store = store
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="gateway-usage", daemon=True)
        self._thread.start()

    def count(self, key_id: str) -> None:
        self._queue.put(key_id)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                for key_id, n in Counter(i for i in items if i is not _STOP).items():
                    counters.reserve(self._store, usage_key(key_id), n, None)
            except Exception:  # the store may be down; the calls already finished
                log.exception("could not count %d key requests", len(items))
            finally:
                for _ in items:
                    self._queue.task_done()
            if any(i is _STOP for i in items):
                return

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
