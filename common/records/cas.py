"""The one compare-and-swap read-modify-write: read the record, let ``mutate`` change it, validate
the result through the resource's model, write it only if the record's revision is unchanged, and
retry a bounded number of times when another writer got there first.

``swap`` is the loop itself, over a raw value (a counter, a record that is created when absent);
``update`` is the typed form every resource's records module uses. Nothing else in fabricd writes
its own retry loop: a caller that used to give up quietly catches ``Contended``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from common.errors import Conflict, NotFound
from common.store.base import KV, Store

M = TypeVar("M", bound=BaseModel)
RETRIES = 10


class Contended(Conflict):
    """The record changed on every try; the caller may try again."""


def parse(model: type[M], value: str) -> M:
    # "stored": a record loads as it was accepted (docs: orchestration_state._parse).
    return model.model_validate_json(value, context={"stored": True})


def validated(model: type[M], record: BaseModel) -> M:
    """``record`` checked through ``model`` as a stored record (what every write goes through)."""
    return model.model_validate(record.model_dump(), context={"stored": True})


def swap(store: Store, key: str, change: Callable[[KV | None], str | None], *, retries: int = RETRIES,
         busy: str = "") -> bool:
    """The CAS loop on a raw value. ``change(kv)`` (kv None: the key is absent) returns the value to
    write, or None to leave the key as it is; an absent key is written with create-if-absent.
    True when a value was written, False when ``change`` left it; Contended after ``retries``
    lost races (``busy`` is its message)."""
    for _ in range(retries):
        kv = store.get(key)
        value = change(kv)
        if value is None:
            return False
        if store.create(key, value) if kv is None else store.cas(key, value, kv.mod_revision):
            return True
    raise Contended(busy or f"{key} changed too often; try again", code="contended")


def update(store: Store, key: str, model: type[M], mutate: Callable[[M], M | None], *, kind: str, name: str,
           retries: int = RETRIES, busy: str = "") -> M:
    """Apply ``mutate`` (returns the new record, or None for "leave it as it is") under CAS.
    NotFound when the key is absent; Contended after ``retries`` lost races (``busy`` is its
    message; default "<kind> '<name>' changed too often; try again")."""
    result: list[M] = []

    def change(kv: KV | None) -> str | None:
        if kv is None:
            raise NotFound(f"{kind} {name!r} not found")
        current = parse(model, kv.value)
        changed = mutate(current.model_copy(deep=True))
        result[:] = [current if changed is None else validated(model, changed)]
        return None if changed is None else result[0].model_dump_json()

    swap(store, key, change, retries=retries, busy=busy or f"{kind} {name!r} changed too often; try again")
    return result[0]
