"""An append-only audit log whose rows form a SHA-256 hash chain in the store.

Row n lives at ``keyspace.audit(f"{n:012d}")`` and carries ``prev`` (row n-1's hash) and
``hash`` = SHA-256 over the canonical JSON of every other field. Appending is exact under
several processes: a writer takes sequence n with create-if-absent; a loser reads the winner's
row and tries n+1, so no two rows share a number and every row links to its predecessor.
A tip hint (``keyspace.audit("tip")`` -> last seq) saves scanning; it may lag, never lead.

verify() recomputes every hash and link and names the first row that does not match, so an
edited, inserted or deleted row is found. Rows hold outcome data only (kind, status, tokens,
latency, key id, endpoint); prompts and keys are never put in a row.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from common import keyspace
from common.store.base import Store

KINDS = ("ATTEMPT", "SUCCESS", "FAILED")
GENESIS = "0" * 64
TIP = "tip"
ALLOWED_FIELDS = {"request_id", "key_id", "tenant", "endpoint", "model", "status", "tokens", "latency_ms", "reason"}


def _row_key(seq: int) -> str:
    return keyspace.audit(f"{seq:012d}")


def row_hash(row: dict) -> str:
    body = {k: v for k, v in row.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class AuditChain:
    """One writer per process; it remembers its last seen tip so appends are usually one create."""

    store: Store
    _seq: int = -1
    _prev: str = GENESIS
    _loaded: bool = field(default=False)

    def _load_tip(self) -> None:
        kv = self.store.get(keyspace.audit(TIP))
        seq = int(kv.value) if kv else 0
        row = self.store.get(_row_key(seq)) if seq else None
        if row is None:
            self._seq, self._prev = 0, GENESIS
        else:
            self._seq, self._prev = seq, json.loads(row.value)["hash"]
        self._loaded = True

    def append(self, kind: str, *, update_tip: bool = True, **fields) -> dict:
        """Append one row. update_tip=False skips the tip hint write (a batch writer updates it
        on its last row); the hint may lag, and a lagging hint only costs a short walk forward."""
        if kind not in KINDS:
            raise ValueError(f"audit kind {kind!r} is not one of {KINDS}")
        unknown = set(fields) - ALLOWED_FIELDS
        if unknown:
            raise ValueError(f"audit fields {sorted(unknown)} are not allowed in a row")
        if not self._loaded:
            self._load_tip()
        while True:
            seq = self._seq + 1
            row = {"seq": seq, "ts": time.time(), "kind": kind, "prev": self._prev, **fields}
            row["hash"] = row_hash(row)
            if self.store.create(_row_key(seq), json.dumps(row, sort_keys=True)):
                self._seq, self._prev = seq, row["hash"]
                if update_tip:
                    self.store.put(keyspace.audit(TIP), str(seq))
                return row
            # Another writer took seq: follow the chain forward to the real tip.
            kv = self.store.get(_row_key(seq))
            if kv is not None:
                self._seq, self._prev = seq, json.loads(kv.value)["hash"]


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    rows: int
    bad_seq: int | None = None
    reason: str = ""


def read_rows(store: Store) -> list[dict]:
    return [json.loads(kv.value) for kv in store.list(keyspace.audit()) if not kv.key.endswith("/" + TIP)]


def verify(store: Store) -> VerifyResult:
    rows = read_rows(store)
    prev = GENESIS
    for i, row in enumerate(rows, start=1):
        if row.get("seq") != i:
            return VerifyResult(False, len(rows), i, f"row {i} is missing or out of order")
        if row.get("prev") != prev:
            return VerifyResult(False, len(rows), i, f"row {i} does not link to row {i - 1}")
        if row_hash(row) != row.get("hash"):
            return VerifyResult(False, len(rows), i, f"row {i} was altered (hash mismatch)")
        prev = row["hash"]
    return VerifyResult(True, len(rows))
