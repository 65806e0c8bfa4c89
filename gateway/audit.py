"""The gateway's audit writer: rows go to the store's hash chain from one background thread.

The request path only enqueues (microseconds); a single writer thread appends in enqueue order,
so a call's ATTEMPT row always precedes its SUCCESS/FAILED row. The writer takes everything
queued (up to BATCH rows) and appends it with one store transaction: profiling the 64-client
tail showed one SQLite commit per row (two per call) as the largest cost in the process, all of
it competing with the event loop; the tip hint is written at most once a second. flush() waits for the queue to
drain (tests, shutdown). Rows carry outcome data only: no prompt, no key, no header values.

Refused authentication is audited too (a FAILED row with the credential's non-secret name: a
key's prefix or "jwt"), at most REFUSALS_PER_SEC rows a second per process; refusals above
that are counted into the next row written (``reason`` "... (+N not audited)") so a flood of
bad credentials cannot turn into a flood of store writes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from common.audit_chain import AuditChain
from common.store.base import Store

log = logging.getLogger("fabric.gateway.audit")
_STOP = object()
REFUSALS_PER_SEC = 20
BATCH = 256
TIP_EVERY_SECS = 1.0


class AuditWriter:
    def __init__(self, store: Store):
        self._chain = AuditChain(store)
        self._queue: queue.Queue = queue.Queue()
        self._tokens, self._refill_at, self._unaudited = float(REFUSALS_PER_SEC), time.monotonic(), 0
        self._thread = threading.Thread(target=self._run, name="gateway-audit", daemon=True)
        self._thread.start()

    def record(self, kind: str, **fields) -> None:
        self._queue.put((kind, fields))

    def record_refusal(self, **fields) -> bool:
        """A refused authentication, rate-limited; True when a row was queued."""
        now = time.monotonic()
        self._tokens = min(REFUSALS_PER_SEC, self._tokens + (now - self._refill_at) * REFUSALS_PER_SEC)
        self._refill_at = now
        if self._tokens < 1:
            self._unaudited += 1
            return False
        self._tokens -= 1
        if self._unaudited:
            fields["reason"] = f"{fields.get('reason', '')} (+{self._unaudited} not audited)"
            self._unaudited = 0
        self.record("FAILED", **fields)
        return True

    def _run(self) -> None:
        tip_at = 0.0
        while True:
            items = [self._queue.get()]
            while len(items) < BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in items)
            rows = [item for item in items if item is not _STOP]
            try:
                now = time.monotonic()
                update_tip = now - tip_at >= TIP_EVERY_SECS or self._queue.empty()
                self._chain.append_many(rows, update_tip=update_tip)
                if update_tip:
                    tip_at = now
            except Exception:  # the store may be down; the requests already finished
                log.exception("%d audit rows (first request %s) could not be written", len(rows),
                              rows[0][1].get("request_id") if rows else None)
            finally:
                for _ in items:
                    self._queue.task_done()
            if stop:
                return

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
