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

What a caller can size is bounded: every string field of a row is cut to MAX_FIELD_CHARS (the
request parser already refuses a long ``model``), a batch is split so that no store write holds
more than MAX_BATCH_BYTES of rows (etcd refuses a request over 1.5 MiB, and a refused batch
would lose other callers' rows), and at most MAX_PENDING_ROWS wait for the writer: beyond that
a row is dropped and counted (``fabric_gateway_audit_dropped_total{reason}``), never silently.
"""

from __future__ import annotations

import time

from common.audit_chain import AuditChain
from common.store.base import Store
from gateway.batch_writer import BatchWriter

REFUSALS_PER_SEC = 20
TIP_EVERY_SECS = 1.0
MAX_FIELD_CHARS = 256
MAX_BATCH_BYTES = 256 * 1024
MAX_PENDING_ROWS = 50_000
TRUNCATED = "...(truncated)"


def capped(fields: dict) -> dict:
    """The row's fields with every string cut to MAX_FIELD_CHARS (marked as cut)."""
    out = fields
    for name, value in fields.items():
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            if out is fields:
                out = dict(fields)
            out[name] = value[:MAX_FIELD_CHARS - len(TRUNCATED)] + TRUNCATED
    return out


def row_bytes(kind: str, fields: dict) -> int:
    """About what a row adds to a chain entry (its JSON, with the field names)."""
    return len(kind) + 16 + sum(len(k) + 6 + (len(v) if isinstance(v, str) else 24) for k, v in fields.items())


def split_by_bytes(rows: list, limit: int = MAX_BATCH_BYTES) -> list[list]:
    """Consecutive runs of rows, in order, each at most ``limit`` bytes (a lone bigger row alone)."""
    runs: list[list] = []
    run: list = []
    size = 0
    for row in rows:
        n = row_bytes(*row)
        if run and size + n > limit:
            runs.append(run)
            run, size = [], 0
        run.append(row)
        size += n
    if run:
        runs.append(run)
    return runs


class AuditWriter:
    def __init__(self, store: Store, on_drop=None, max_pending: int = MAX_PENDING_ROWS):
        self._chain = AuditChain(store)
        self._tokens, self._refill_at, self._unaudited = float(REFUSALS_PER_SEC), time.monotonic(), 0
        self._tip_at = 0.0
        self._writer = BatchWriter(self._append, name="gateway-audit", max_pending=max_pending, on_drop=on_drop)

    @property
    def dropped(self) -> int:
        return self._writer.dropped

    def record(self, kind: str, **fields) -> None:
        self._writer.add((kind, capped(fields)))

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
        runs = split_by_bytes(rows)
        for i, run in enumerate(runs):
            self._chain.append_many(run, update_tip=update_tip and i == len(runs) - 1)
        if update_tip:
            self._tip_at = now

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
