"""The one compare-and-swap read-modify-write: read the record, let ``mutate`` change it, validate
the result through the resource's model, write it only if the record's revision is unchanged, and
retry a bounded number of times when another writer got there first."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from common.errors import Conflict, NotFound
from common.store.base import Store

M = TypeVar("M", bound=BaseModel)
RETRIES = 10


class Contended(Conflict):
    """The record changed on every try; the caller may try again."""


def parse(model: type[M], value: str) -> M:
    # "stored": a record loads as it was accepted (docs: orchestration_state._parse).
    return model.model_validate_json(value, context={"stored": True})


def update(store: Store, key: str, model: type[M], mutate: Callable[[M], M | None], *, kind: str, name: str,
           retries: int = RETRIES) -> M:
    """Apply ``mutate`` (returns the new record, or None for "leave it as it is") under CAS.
    NotFound when the key is absent; Contended after ``retries`` lost races."""
    for _ in range(retries):
        kv = store.get(key)
        if kv is None:
            raise NotFound(f"{kind} {name!r} not found")
        current = parse(model, kv.value)
        changed = mutate(current.model_copy(deep=True))
        if changed is None:
            return current
        record = model.model_validate(changed.model_dump(), context={"stored": True})
        if store.cas(key, record.model_dump_json(), kv.mod_revision):
            return record
    raise Contended(f"{kind} {name!r} changed too often; try again", code="contended")
