"""Exact counters and fixed windows in the store, shared by every process that uses the store.

Every change is a read then a compare-and-swap on the key's mod_revision (or create-if-absent
for the first write), retried on conflict. A reservation that would pass its limit is refused
without writing, so concurrent callers in several processes can never over-admit: the store
orders the writes and a stale reader's cas fails.

Values are small text: an exact counter is ``"<n>"``; a window is ``"<start> <n>"`` where start
is the window's first second (a new window resets the count in the same cas).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import TransientError
from common.store.base import Store

MAX_ATTEMPTS = 200


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
    for _ in range(MAX_ATTEMPTS):
        kv = store.get(key)
        current = int(kv.value) if kv else 0
        if limit is not None and amount > 0 and current + amount > limit:
            return Outcome(False, current)
        if _write(store, key, str(max(0, current + amount)), kv):
            return Outcome(True, max(0, current + amount))
    raise TransientError(f"counter {key} is too contended; try again")


def read(store: Store, key: str) -> int:
    kv = store.get(key)
    return int(kv.value) if kv else 0


def _parse_window(kv, window_secs: int, now: float) -> tuple[int, int]:
    start = int(now // window_secs) * window_secs
    if kv is None:
        return start, 0
    stored_start, _, n = kv.value.partition(" ")
    return (start, int(n)) if int(stored_start) == start else (start, 0)


def window_reserve(store: Store, key: str, amount: int, limit: int | None, window_secs: int, now: float) -> Outcome:
    """Add amount to the current fixed window unless it would pass limit."""
    for _ in range(MAX_ATTEMPTS):
        kv = store.get(key)
        start, current = _parse_window(kv, window_secs, now)
        if limit is not None and amount > 0 and current + amount > limit:
            return Outcome(False, current, retry_after=max(1.0, math.ceil(start + window_secs - now)))
        new = max(0, current + amount)
        if _write(store, key, f"{start} {new}", kv):
            return Outcome(True, new)
    raise TransientError(f"window {key} is too contended; try again")
