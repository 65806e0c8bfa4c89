"""An append-only audit log whose rows form a SHA-256 hash chain in the store.

Rows are numbered 1, 2, 3... and stored in *entries* at ``keyspace.audit(f"{first:012d}")``:
- version 2 (written now): one entry per batch of rows, ``{"v":2,"hash":H,"body":B}`` where B is
  the JSON text ``{"seq": first row's number, "prev": the previous entry's hash, "ts", "rows":
  [{"kind", ...fields}, ...]}`` and H = SHA-256 of B's bytes exactly as stored; the next entry
  starts at first + len(rows). The gateway's writer appends everything queued in one entry:
  one hash and one store key per batch instead of a canonical encoding, a hash and two SQLite
  rows per row (the writer thread was ~10% of the gateway's CPU per call at 64 clients).
- version 1 (written before 2026-12-01; still verified): one row per entry, its fields plus
  ``prev`` and ``hash`` = SHA-256 over the canonical JSON (sorted keys, compact, ASCII) of
  every other field. A chain may hold version 1 entries followed by version 2 ones; every
  gateway writing one chain must run the same version (an older writer advances one number
  per entry and would write inside a version 2 batch's range: verify then names the break).
Appending is exact under several processes: a writer takes its entry's key with
create-if-absent (common.records.audit_log); a loser follows the entries forward to the real end
and tries again on the one loop (common.records.cas), so no two entries share a number and every
entry links to its predecessor. A tip hint
(``keyspace.audit("tip")`` -> "<last row> <its entry's hash>") saves scanning; it may lag,
never lead.

verify() recomputes every hash and link and names the first row of the first entry that does
not match, so an edited, inserted or deleted entry is found. A chain cut short at its end still
links, so verify() also compares it with a stored tip: the store's tip hint (a hint that leads
the chain means rows were removed from its end), and optionally a tip kept outside the store
(``Tip``, e.g. the file `fabric-gateway verify-audit --tip-file` maintains): the chain must
still hold that row in an entry with that hash. read_rows() gives every row on its own (its
number, its entry's ts, prev and hash, and its fields), whatever the version. Rows hold outcome
data only (kind, status, tokens, latency, key id, endpoint); prompts and keys are never put in
a row.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import orjson

from common.records import audit_log, cas
from common.store.base import Store

KINDS = ("ATTEMPT", "SUCCESS", "FAILED")
GENESIS = "0" * 64
_PLAIN = (str, int, bool, type(None))  # types orjson and json write alike (ASCII text aside)
# would_refuse: the limits in shadow mode (gateway.shadow) that would have refused the call
ALLOWED_FIELDS = {"request_id", "key_id", "tenant", "endpoint", "model", "status", "tokens", "latency_ms", "reason",
                  "would_refuse"}



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


_V2_HEAD = '{"v":2,"hash":"'
_V2_BODY = '","body":'
_V2_AT = len(_V2_HEAD) + 64 + len(_V2_BODY)  # where the body starts in a version 2 entry


def _encode(body: dict) -> str:
    try:
        return orjson.dumps(body).decode()
    except TypeError:  # orjson.JSONEncodeError: an int past 64 bits, a lone surrogate
        return json.dumps(body, separators=(",", ":"))


def seal(seq: int, prev: str, ts: float, rows: list[dict]) -> tuple[str, str]:
    """(hash, stored value) of a version 2 entry holding rows (each {"kind", ...fields})."""
    body = _encode({"seq": seq, "prev": prev, "ts": ts, "rows": rows})
    digest = hashlib.sha256(body.encode()).hexdigest()
    return digest, f"{_V2_HEAD}{digest}{_V2_BODY}{body}}}"


class BadEntry(ValueError):
    pass


@dataclass(frozen=True)
class Entry:
    """One stored entry, either version: its first row's number, its rows (seq, ts, prev and hash
    filled in), the hash it links from, its own hash, and whether that hash matches its content."""

    seq: int
    prev: str
    hash: str
    intact: bool
    rows: list[dict]


def parse_entry(value: str) -> Entry:
    """BadEntry for a value that is neither version's shape (not JSON, fields missing)."""
    try:
        if value.startswith(_V2_HEAD) and value[_V2_AT - len(_V2_BODY):_V2_AT] == _V2_BODY and value.endswith("}"):
            digest, text = value[len(_V2_HEAD):_V2_AT - len(_V2_BODY)], value[_V2_AT:-1]
            body = json.loads(text)
            seq, prev, ts = int(body["seq"]), str(body["prev"]), body["ts"]
            rows = [{**row, "seq": seq + i, "ts": ts, "prev": prev, "hash": digest}
                    for i, row in enumerate(body["rows"])]
            if not rows:
                raise BadEntry("an entry without rows")
            intact = hashlib.sha256(text.encode()).hexdigest() == digest
            return Entry(seq, prev, digest, intact, rows)
        row = json.loads(value)
        if row.get("v") == 2:  # a version 2 entry whose framing was altered
            raise BadEntry("a version 2 entry in another shape")
        return Entry(int(row["seq"]), str(row["prev"]), str(row["hash"]), row_hash(row) == row["hash"], [row])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadEntry(str(exc)) from None


@dataclass
class AuditChain:
    """One writer per process; it remembers the chain's end (last row, its entry's hash) so an
    append is usually one create."""

    store: Store
    _seq: int = -1
    _prev: str = GENESIS
    _loaded: bool = field(default=False)

    def _load_tip(self) -> None:
        hint = audit_log.tip(self.store)
        tip = parse_tip(hint) if hint else Tip(0)
        if tip.seq and tip.hash:  # may lag (the append then walks forward), never leads
            self._seq, self._prev = tip.seq, tip.hash
        else:  # none yet, or a hint without a hash: walk from the start
            self._seq, self._prev = 0, GENESIS
        self._loaded = True

    def append(self, kind: str, *, update_tip: bool = True, **fields) -> int:
        """Append one row (an entry of its own); its number. update_tip=False skips the tip hint
        write (a batch writer updates it now and then); the hint may lag, and a lagging hint only
        costs a short walk forward."""
        return self.append_many([(kind, fields)], update_tip=update_tip)

    def append_many(self, entries: list[tuple[str, dict]], *, update_tip: bool = True) -> int:
        """Append rows in order as one version 2 entry (one hash, one store key): under load the
        audit writer appends a batch of calls' rows at once. The first row's number (0: none)."""
        rows = []
        for kind, fields in entries:
            if kind not in KINDS:
                raise ValueError(f"audit kind {kind!r} is not one of {KINDS}")
            if not fields.keys() <= ALLOWED_FIELDS:
                raise ValueError(f"audit fields {sorted(set(fields) - ALLOWED_FIELDS)} are not allowed in a row")
            rows.append({"kind": kind, **fields})
        if not rows:
            return 0
        if not self._loaded:
            self._load_tip()
        now = time.time()

        def attempt() -> int | None:
            first = self._seq + 1
            digest, value = seal(first, self._prev, now, rows)
            if audit_log.claim(self.store, first, value):
                self._seq, self._prev = first + len(rows) - 1, digest
                if update_tip:
                    audit_log.put_tip(self.store, f"{self._seq} {self._prev}")
                return first
            # Another writer took this number: follow the entries forward to the real end.
            while (text := audit_log.entry(self.store, self._seq + 1)) is not None:
                entry = parse_entry(text)
                self._seq, self._prev = entry.seq + len(entry.rows) - 1, entry.hash
            return None

        return cas.retry(attempt, "the audit chain's end moved on every try; try again")


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
    """Every row on its own, in order (an unreadable entry is skipped: verify names it)."""
    rows = []
    for _, value in audit_log.entries(store):
        try:
            rows += parse_entry(value).rows
        except BadEntry:
            continue
    return rows


def verify(store: Store, stored_tip: Tip | None = None) -> VerifyResult:
    hint = audit_log.tip(store)  # before the rows: a row appended meanwhile makes it lag, not lead
    result, spans = _verify_links(audit_log.entries(store))
    if not result.ok:
        return result
    for tip, where in ((parse_tip(hint) if hint else None, "the store's tip"), (stored_tip, "the stored tip")):
        if tip is None or tip.seq == 0:
            continue
        if tip.seq > result.rows:
            return VerifyResult(False, result.rows, result.rows + 1,
                                f"the chain ends at row {result.rows} but {where} is row {tip.seq}: rows were removed")
        digest = next(h for first, last, h in spans if first <= tip.seq <= last)
        if tip.hash and digest != tip.hash:
            return VerifyResult(False, result.rows, tip.seq, f"row {tip.seq} differs from {where}: the chain was rewritten")
    return result


def tip_of(rows_or_store) -> Tip:
    rows = read_rows(rows_or_store) if not isinstance(rows_or_store, list) else rows_or_store
    return Tip(rows[-1]["seq"], rows[-1]["hash"]) if rows else Tip(0)


def _verify_links(entries: list[tuple[str, str]]) -> tuple[VerifyResult, list[tuple[int, int, str]]]:
    """Every entry in key order: its number follows the last, it links to the last, its hash
    matches. Also (first row, last row, hash) of each entry, for the tip checks."""
    prev, expected = GENESIS, 1
    spans: list[tuple[int, int, str]] = []
    total = len(entries)
    for key, value in entries:
        try:
            entry = parse_entry(value)
        except BadEntry:
            return VerifyResult(False, total, expected, f"row {expected}'s entry {key} is unreadable"), spans
        if entry.seq != expected or key != audit_log.entry_key(entry.seq):
            return VerifyResult(False, total, expected, f"row {expected} is missing or out of order"), spans
        if entry.prev != prev:
            return VerifyResult(False, total, expected, f"row {expected} does not link to row {expected - 1}"), spans
        if not entry.intact:
            return VerifyResult(False, total, expected, f"row {expected} was altered (hash mismatch)"), spans
        last = expected + len(entry.rows) - 1
        spans.append((expected, last, entry.hash))
        prev, expected = entry.hash, last + 1
    return VerifyResult(True, expected - 1), spans
