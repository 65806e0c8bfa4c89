"""The one read-modify-write loop and its one retry policy: read, decide, write only if nothing
changed since the read, and try again when another writer got there first, at most RETRIES
times with a short random pause that doubles (up to PAUSE_MAX_S) between tries. After the last
lost race the caller gets ``Contended`` (common.errors: transient, 503 with Retry-After).

``retry`` is the loop itself, over any conditional write (``attempt`` returns None when it lost);
``swap`` is it over one raw value (a counter, a record created when absent); ``update`` is the
typed form every resource's records module uses. Nothing else in any process writes its own
retry loop (tests/common/test_store_door.py counts them)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from common.errors import Contended, NotFound
from common.records import reading
from common.store.base import KV, Store

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
RETRIES = 20
PAUSE_S, PAUSE_MAX_S = 0.001, 0.05

__all__ = ["Contended", "M", "RETRIES", "retry", "swap", "update", "validated"]


def validated(model: type[M], record: BaseModel) -> M:
    """``record`` checked through ``model`` as a stored record (what every write goes through)."""
    return model.model_validate(record.model_dump(), context={"stored": True})


def retry(attempt: Callable[[], T | None], busy: str) -> T:
    """Run ``attempt`` (read, decide, conditional write) until it returns a result; None means it
    lost a race. Contended (message ``busy``) after RETRIES lost races."""
    for n in range(RETRIES):
        result = attempt()
        if result is not None:
            return result
        if n + 1 < RETRIES:
            time.sleep(random.uniform(0, min(PAUSE_MAX_S, PAUSE_S * 2 ** n)))
    raise Contended(busy)


def swap(store: Store, key: str, change: Callable[[KV | None], str | None], *, busy: str = "") -> bool:
    """The loop on one raw value. ``change(kv)`` (kv None: the key is absent) returns the value to
    write, or None to leave the key as it is; an absent key is written with create-if-absent.
    True when a value was written, False when ``change`` left it; Contended (``busy`` is its
    message) when every try lost a race."""
    def attempt() -> bool | None:
        kv = store.get(key)
        value = change(kv)
        if value is None:
            return False
        won = store.create(key, value) if kv is None else store.cas(key, value, kv.mod_revision)
        return True if won else None

    return retry(attempt, busy or f"{key} changed too often; try again")


def update(store: Store, key: str, model: type[M], mutate: Callable[[M], M | None], *, kind: str, name: str,
           busy: str = "") -> M:
    """Apply ``mutate`` (returns the new record, or None for "leave it as it is") under CAS.
    NotFound when the key is absent; UnreadableRecord when it does not parse; Contended when every try lost a race (``busy`` is its
    message; default "<kind> '<name>' changed too often; try again")."""
    result: list[M] = []

    def change(kv: KV | None) -> str | None:
        if kv is None:
            raise NotFound(f"{kind} {name!r} not found")
        current = reading.one(model, kv, kind)
        changed = mutate(current.model_copy(deep=True))
        result[:] = [current if changed is None else validated(model, changed)]
        return None if changed is None else result[0].model_dump_json()

    swap(store, key, change, busy=busy or f"{kind} {name!r} changed too often; try again")
    return result[0]
