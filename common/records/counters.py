"""Exact counters and fixed windows in the store, shared by every process that uses the store.

Every change is a read then a compare-and-swap on the key's mod_revision (or create-if-absent
for the first write), retried by the one loop (common.records.cas.retry; Contended when it keeps
losing). A reservation that would pass its limit is refused
without writing, so concurrent callers in several processes can never over-admit: the store
orders the writes and a stale reader's cas fails.

Values are small text: an exact counter is ``"<n>"``; a window is ``"<start> <n>"`` where start
is the window's first second (a new window resets the count in the same cas). A window may be
written under a lease (``lease=``) so a key nobody touches disappears after its window.

A held counter (in-flight slots) is a JSON object ``{holder: n}``: each process counts its own
slots under its holder name, and the total is the sum over LIVE holders only (``is_live``: the
holder's lease key still exists). So a process that dies without releasing gives its slots back
when its lease expires, while the one compare-and-swap per change keeps the total exact across
processes. A change drops dead holders' entries; a key with no slot left is deleted. Holders are
``counters/holders/<name>`` keys under their process's lease (``register_holder``); held counters
live under ``counters/slots/`` (``held_key``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from common import keyspace
from common.records import cas
from common.store.base import Store

HOLDERS = keyspace.counters("holders/")  # a live holder's key, under its lease
SLOTS = keyspace.counters("slots/")  # held counters


@dataclass(frozen=True)
class Outcome:
    ok: bool
    value: int  # the count after the change (ok) or the count that refused it
    retry_after: float = 0.0


def _write(store: Store, key: str, value: str, kv) -> bool:
    if kv is None:
        return store.create(key, value)
    return store.cas(key, value, kv.mod_revision)


def reserve(store: Store, key: str, amount: int, limit: int | None) -> Outcome:
    """Add amount unless the total would pass limit (None: no limit)."""
    def attempt() -> Outcome | None:
        kv = store.get(key)
        current = int(kv.value) if kv else 0
        if limit is not None and amount > 0 and current + amount > limit:
            return Outcome(False, current)
        if _write(store, key, str(max(0, current + amount)), kv):
            return Outcome(True, max(0, current + amount))
        return None

    return cas.retry(attempt, f"counter {key} is too contended; try again")


def read(store: Store, key: str) -> int:
    kv = store.get(key)
    return int(kv.value) if kv else 0


def window_read(store: Store, key: str, window_secs: int, now: float) -> int:
    """The count of the window containing ``now`` (0 when the stored one is older)."""
    kv = store.get(key)
    return 0 if kv is None else window_value(kv.value, window_secs, now)


def window_value(value: str, window_secs: int, now: float) -> int:
    """The count a stored window value holds for the window containing ``now`` (0: another one)."""
    return period_value(value, int(now // window_secs) * window_secs)


def window_reserve(store: Store, key: str, amount: int, limit: int | None, window_secs: int, now: float,
                   lease: int | None = None) -> Outcome:
    """Add amount to the current fixed window unless it would pass limit. With a lease, the key
    is (re)attached to it on every write; the caller keeps the lease alive past the window."""
    start = int(now // window_secs) * window_secs
    return period_reserve(store, key, amount, limit, start, start + window_secs, now, lease)


def period_value(value: str, start: int) -> int:
    """The count a stored window value holds for the period starting at ``start`` (0: another one)."""
    stored_start, _, n = value.partition(" ")
    try:
        return int(n) if int(stored_start) == start else 0
    except ValueError:
        return 0


def period_reserve(store: Store, key: str, amount: int, limit: int | None, start: int, end: float, now: float,
                   lease: int | None = None) -> Outcome:
    """Add amount to the period [start, end) (a fixed window, or a calendar day or month) unless it
    would pass limit; a stored value of another period counts as 0 and is replaced."""
    def attempt() -> Outcome | None:
        kv = store.get(key)
        current = period_value(kv.value, start) if kv is not None else 0
        if limit is not None and amount > 0 and current + amount > limit:
            return Outcome(False, current, retry_after=max(1.0, math.ceil(end - now)))
        new = max(0, current + amount)
        value = f"{start} {new}"
        ok = store.create(key, value, lease=lease) if kv is None else store.cas(key, value, kv.mod_revision,
                                                                                 lease=lease)
        return Outcome(True, new) if ok else None

    return cas.retry(attempt, f"window {key} is too contended; try again")


def parse_held(value: str | None) -> dict[str, int]:
    """A held counter's {holder: n}; anything else (an old plain count) holds nothing."""
    if not value:
        return {}
    try:
        data = json.loads(value)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(h): n for h, n in data.items() if isinstance(n, int) and n > 0}


def held_reserve(store: Store, key: str, holder: str, amount: int, limit: int | None,
                 is_live: Callable[[str], bool]) -> Outcome:
    """Add amount to holder's slots unless the live total would pass limit (amount < 0 frees)."""
    def attempt() -> Outcome | None:
        kv = store.get(key)
        held = {h: n for h, n in parse_held(kv.value if kv else None).items() if h == holder or is_live(h)}
        total = sum(held.values())
        if limit is not None and amount > 0 and total + amount > limit:
            return Outcome(False, total)
        mine = held.get(holder, 0) + amount
        if mine > 0:
            held[holder] = mine
        else:
            held.pop(holder, None)
        if not held:
            ok = kv is None or store.delete(key, mod_revision=kv.mod_revision)
        else:
            ok = _write(store, key, json.dumps(held, sort_keys=True, separators=(",", ":")), kv)
        return Outcome(True, sum(held.values())) if ok else None

    return cas.retry(attempt, f"counter {key} is too contended; try again")


def held_key(name: str) -> str:
    """The held counter ``name`` (an endpoint's, a key's ... in-flight slots)."""
    return SLOTS + name


def register_holder(store: Store, holder: str, info: dict, lease_secs: int) -> int:
    """Register ``holder`` (with ``info``: its gateway id, pid, start) under a fresh lease of
    ``lease_secs``; the lease id, which the holder refreshes to stay live."""
    lease = store.grant_lease(lease_secs)
    store.put(HOLDERS + holder, json.dumps(info, sort_keys=True), lease=lease.id)
    return lease.id


def live_holders(store: Store) -> frozenset[str]:
    """Every holder whose lease is alive."""
    return frozenset(kv.key[len(HOLDERS):] for kv in store.list(HOLDERS))


def holder_alive(store: Store, holder: str) -> bool:
    return store.get(HOLDERS + holder) is not None


def held_counters(store: Store) -> list[tuple[str, dict[str, int]]]:
    """(name under the slots prefix, {holder: n}) of every held counter, in key order."""
    return [(kv.key[len(SLOTS):], parse_held(kv.value)) for kv in store.list(SLOTS)]
