"""An append-only audit log whose rows form a SHA-256 hash chain in the store.

Row n lives at ``keyspace.audit(f"{n:012d}")`` and carries ``prev`` (row n-1's hash) and
``hash`` = SHA-256 over the canonical JSON of every other field. Appending is exact under
several processes: a writer takes sequence n with create-if-absent; a loser reads the winner's
row and tries n+1, so no two rows share a number and every row links to its predecessor.
A tip hint (``keyspace.audit("tip")`` -> "<last seq> <its hash>") saves scanning; it may lag,
never lead.

verify() recomputes every hash and link and names the first row that does not match, so an
edited, inserted or deleted row is found. A chain cut short at its end still links, so verify()
also compares it with a stored tip: the store's tip hint (a hint that leads the chain means rows
were removed from its end), and optionally a tip kept outside the store (``Tip``, e.g. the file
`fabric-gateway verify-audit --tip-file` maintains): the chain must still hold that row with
that hash. Rows hold outcome data only (kind, status, tokens,
latency, key id, endpoint); prompts and keys are never put in a row.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import orjson

from common import keyspace
from common.store.base import Store

KINDS = ("ATTEMPT", "SUCCESS", "FAILED")
GENESIS = "0" * 64
TIP = "tip"
_PLAIN = (str, int, bool, type(None))  # types orjson and json write alike (ASCII text aside)
ALLOWED_FIELDS = {"request_id", "key_id", "tenant", "endpoint", "model", "status", "tokens", "latency_ms", "reason"}


def _row_key(seq: int) -> str:
    return keyspace.audit(f"{seq:012d}")


def _canonical(body: dict) -> str:
    """The hashed form: json.dumps with sorted keys, no spaces, ASCII only. orjson writes the
    same text several times faster for what rows hold -- strings, ints, None, and floats in the
    range both print without an exponent -- and is used when it does; anything else (DEL or a non-ASCII
    character, which json escapes and orjson does not, another float, another type) goes to json.
    tests/common/test_audit_chain_canonical.py checks the two agree on generated rows."""
    if all(type(v) in _PLAIN or (type(v) is float and (v == 0 or 1e-4 <= abs(v) < 1e16)) for v in body.values()):
        try:
            text = orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()
        except TypeError:  # orjson.JSONEncodeError: an int past 64 bits, a lone surrogate
            pass
        else:
            if text.isascii() and text.isprintable():  # json escapes DEL and every non-ASCII character
                return text
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def row_hash(row: dict) -> str:
    body = {k: v for k, v in row.items() if k != "hash"}
    return hashlib.sha256(_canonical(body).encode()).hexdigest()


def _sealed(row: dict) -> tuple[str, str]:
    """(hash, stored JSON) of a row without its hash: the canonical text is hashed, and stored
    with the hash appended, so a row is encoded once (the audit writer's largest cost was
    encoding every row twice); readers parse it, verify() re-hashes the parsed fields."""
    body = _canonical(row)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return digest, f'{body[:-1]},"hash":"{digest}"}}'


@dataclass
class AuditChain:
    """One writer per process; it remembers its last seen tip so appends are usually one create."""

    store: Store
    _seq: int = -1
    _prev: str = GENESIS
    _loaded: bool = field(default=False)

    def _load_tip(self) -> None:
        kv = self.store.get(keyspace.audit(TIP))
        seq = parse_tip(kv.value).seq if kv else 0
        row = self.store.get(_row_key(seq)) if seq else None
        if row is None:
            self._seq, self._prev = 0, GENESIS
        else:
            self._seq, self._prev = seq, json.loads(row.value)["hash"]
        self._loaded = True

    def append(self, kind: str, *, update_tip: bool = True, **fields) -> dict:
        """Append one row. update_tip=False skips the tip hint write (a batch writer updates it
        now and then); the hint may lag, and a lagging hint only costs a short walk forward."""
        return self.append_many([(kind, fields)], update_tip=update_tip)[0]

    def append_many(self, entries: list[tuple[str, dict]], *, update_tip: bool = True) -> list[dict]:
        """Append rows in order with one store transaction (create_all): under load the audit
        writer commits a batch of rows at once instead of one commit per row."""
        for kind, fields in entries:
            if kind not in KINDS:
                raise ValueError(f"audit kind {kind!r} is not one of {KINDS}")
            unknown = set(fields) - ALLOWED_FIELDS
            if unknown:
                raise ValueError(f"audit fields {sorted(unknown)} are not allowed in a row")
        if not entries:
            return []
        if not self._loaded:
            self._load_tip()
        now = time.time()
        while True:
            rows, stored, prev = [], [], self._prev
            for n, (kind, fields) in enumerate(entries, start=self._seq + 1):
                row = {"seq": n, "ts": now, "kind": kind, "prev": prev, **fields}
                prev, text = _sealed(row)
                row["hash"] = prev
                rows.append(row)
                stored.append((_row_key(n), text))
            if self.store.create_all(stored):
                self._seq, self._prev = rows[-1]["seq"], rows[-1]["hash"]
                if update_tip:
                    self.store.put(keyspace.audit(TIP), f"{self._seq} {self._prev}")
                return rows
            # Another writer took some of these numbers: follow the chain forward to the real tip.
            while (kv := self.store.get(_row_key(self._seq + 1))) is not None:
                self._seq, self._prev = self._seq + 1, json.loads(kv.value)["hash"]


@dataclass(frozen=True)
class Tip:
    seq: int
    hash: str | None = None


def parse_tip(value: str) -> Tip:
    seq, _, digest = value.strip().partition(" ")
    return Tip(int(seq), digest or None)


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    rows: int
    bad_seq: int | None = None
    reason: str = ""


def read_rows(store: Store) -> list[dict]:
    return [json.loads(kv.value) for kv in store.list(keyspace.audit()) if not kv.key.endswith("/" + TIP)]


def verify(store: Store, stored_tip: Tip | None = None) -> VerifyResult:
    hint = store.get(keyspace.audit(TIP))  # before the rows: a row appended meanwhile makes it lag, not lead
    rows = read_rows(store)
    result = _verify_links(rows)
    if not result.ok:
        return result
    by_seq = {r["seq"]: r for r in rows}
    for tip, where in ((parse_tip(hint.value) if hint else None, "the store's tip"), (stored_tip, "the stored tip")):
        if tip is None or tip.seq == 0:
            continue
        row = by_seq.get(tip.seq)
        if row is None:
            return VerifyResult(False, len(rows), len(rows) + 1,
                                f"the chain ends at row {len(rows)} but {where} is row {tip.seq}: rows were removed")
        if tip.hash and row["hash"] != tip.hash:
            return VerifyResult(False, len(rows), tip.seq, f"row {tip.seq} differs from {where}: the chain was rewritten")
    return result


def tip_of(rows_or_store) -> Tip:
    rows = read_rows(rows_or_store) if not isinstance(rows_or_store, list) else rows_or_store
    return Tip(rows[-1]["seq"], rows[-1]["hash"]) if rows else Tip(0)


def _verify_links(rows: list[dict]) -> VerifyResult:
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
