"""The gateway's audit writer: rows go to the store's hash chain from one background thread.

The request path only enqueues (microseconds); a single writer thread appends in enqueue order,
so a call's ATTEMPT row always precedes its SUCCESS/FAILED row. The writer (gateway.batch_writer)
takes everything queued (up to 512 rows) and appends it with one store transaction: profiling the 64-client
tail showed one SQLite commit per row (two per call) as the largest cost in the process, all of
it competing with the event loop; the tip hint is written at most once a second. flush() waits for the queue to
drain (tests, shutdown). Rows carry outcome data only: no prompt, no key, no header values.

Refused authentication is audited too (a FAILED row with the credential's non-secret name: a
key's prefix or "jwt"), at most REFUSALS_PER_SEC rows a second per process; refusals above
that are counted into the next row written (``reason`` "... (+N not audited)") so a flood of
bad credentials cannot turn into a flood of store writes.
"""

from __future__ import annotations

import time

from common.audit_chain import AuditChain
from common.store.base import Store
from gateway.batch_writer import BatchWriter

REFUSALS_PER_SEC = 20
TIP_EVERY_SECS = 1.0


class AuditWriter:
    def __init__(self, store: Store):
        self._chain = AuditChain(store)
        self._tokens, self._refill_at, self._unaudited = float(REFUSALS_PER_SEC), time.monotonic(), 0
        self._tip_at = 0.0
        self._writer = BatchWriter(self._append, name="gateway-audit")

    def record(self, kind: str, **fields) -> None:
        self._writer.add((kind, fields))

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

    def _append(self, rows: list) -> None:
        now = time.monotonic()
        update_tip = now - self._tip_at >= TIP_EVERY_SECS or not self._writer.pending
        self._chain.append_many(rows, update_tip=update_tip)
        if update_tip:
            self._tip_at = now

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
