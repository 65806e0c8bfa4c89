"""Tokens served per endpoint and per tenant in fixed windows, counted by every gateway process
into the store and read by fabricd's finops (GET /api/ai/finops).

Keys: ``/fabric/counters/finops-tokens/{endpoint|tenant}/{name}``, each a common.counters window
("<start> <n>") of WINDOW_SECS (the clock hour). A window key is written by compare-and-swap, so
several gateways add up exactly; a key whose window has passed reads 0. Names are one safe key
segment (a hash when odd), so a caller-chosen name cannot reach another key.
"""

from __future__ import annotations

import hashlib
import re

from common import counters, keyspace
from common.store.base import Store

WINDOW_SECS = 3600
SCOPES = ("endpoint", "tenant")
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def segment(value: str) -> str:
    return value if _SAFE.match(value) else "h-" + hashlib.blake2b(value.encode(), digest_size=12).hexdigest()


def key(scope: str, name: str) -> str:
    if scope not in SCOPES:
        raise ValueError(f"token window scope {scope!r} is not one of {', '.join(SCOPES)}")
    return keyspace.counters(f"finops-tokens/{scope}/{segment(name)}")


def add(store: Store, scope: str, name: str, tokens: int, now: float) -> None:
    counters.window_reserve(store, key(scope, name), tokens, None, WINDOW_SECS, now)


def read(store: Store, scope: str, name: str, now: float) -> int:
    """Tokens in the window containing ``now`` (0 when the stored window is an older one)."""
    return counters.window_read(store, key(scope, name), WINDOW_SECS, now)


def window_start(now: float) -> int:
    return int(now // WINDOW_SECS) * WINDOW_SECS


def current(store: Store, now: float) -> dict[str, dict[str, int]]:
    """scope -> {name (as its key segment): tokens in the window containing ``now``}, nonzero only."""
    prefix = keyspace.counters("finops-tokens/")
    out: dict[str, dict[str, int]] = {scope: {} for scope in SCOPES}
    for kv in store.list(prefix):
        scope, _, name = kv.key[len(prefix):].partition("/")
        n = counters.window_value(kv.value, WINDOW_SECS, now)
        if scope in out and name and n:
            out[scope][name] = n
    return out
