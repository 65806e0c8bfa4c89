"""The gateway's audit writer: rows go to the store's hash chain from one background thread.

The request path only enqueues (microseconds); a single writer thread appends in enqueue order,
so a call's ATTEMPT row always precedes its SUCCESS/FAILED row. flush() waits for the queue to
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
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                kind, fields = item
                try:
                    # The tip hint is written only when the queue drains: one write per row, not two.
                    self._chain.append(kind, update_tip=self._queue.empty(), **fields)
                except Exception:  # the store may be down; the request already finished
                    log.exception("audit row %s for request %s could not be written", kind, fields.get("request_id"))
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        self._queue.join()

    def close(self) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
