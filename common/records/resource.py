"""``Records``: the five verbs of one resource kept as pydantic JSON at one keyspace path. Each
resource's module (deployments.py, endpoints.py, ...) binds one and exports its verbs, so every
kind reads, validates and compare-and-swaps the same way.

``stored``/``stored_items`` answer the JSON exactly as it was written (the API's reads return it as
is, so a record stays readable whatever was added to its model since); everything else is typed.
Reads follow the door's parse policy (common.records.reading): a get of a record that does not
parse raises UnreadableRecord naming it, a list skips it and counts it under the kind."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Generic

from common.errors import Conflict, NotFound
from common.records import cas, reading
from common.records.cas import M
from common.store.base import Store


def readable_values(store: Store, prefix: str, kind: str) -> list[dict]:
    """The JSON objects under ``prefix``, as stored; the rest are skipped and counted."""
    return [data for _kv, data in reading.each_value(store.list(prefix), kind)]


class Records(Generic[M]):
    def __init__(self, model: type[M], key: Callable[..., str], kind: str, name_field: str = "name"):
        self.model, self.key, self.kind, self.name_field = model, key, kind, name_field

    VERBS = ("get", "require", "exists", "stored", "stored_items", "list", "create", "put", "update",
             "upsert", "update_at", "update_status", "delete", "discard", "versioned", "count")

    def verbs(self) -> tuple:
        """The bound verbs in VERBS order, for a resource module to export as its own functions."""
        return tuple(getattr(self, v) for v in self.VERBS)

    def get(self, store: Store, name: str) -> M | None:
        kv = store.get(self.key(name))
        return None if kv is None else reading.one(self.model, kv, self.kind)

    def versioned(self, store: Store, name: str) -> tuple[M, int] | None:
        """(record, mod_revision), for a caller that deletes only what it read (discard's mod_revision)."""
        kv = store.get(self.key(name))
        return None if kv is None else (reading.one(self.model, kv, self.kind), kv.mod_revision)

    def count(self, store: Store) -> int:
        return len(store.list(self.key()))

    def require(self, store: Store, name: str) -> M:
        """The record; NotFound naming it when absent."""
        found = self.get(store, name)
        if found is None:
            raise NotFound(f"{self.kind} {name!r} not found")
        return found

    def exists(self, store: Store, name: str) -> bool:
        return store.get(self.key(name)) is not None

    def stored(self, store: Store, name: str) -> dict | None:
        kv = store.get(self.key(name))
        return None if kv is None else reading.value(kv, self.kind)

    def readable(self, store: Store) -> builtins.list[dict]:
        """Every record as stored that is a JSON object; the rest are skipped and counted (for
        reports that must answer whatever one record holds)."""
        return readable_values(store, self.key(), self.kind)

    def list(self, store: Store) -> builtins.list[M]:
        return reading.each(self.model, store.list(self.key()), self.kind)

    def stored_items(self, store: Store) -> builtins.list[tuple[str, dict]]:
        """(name, JSON as stored) of every record, in key order."""
        prefix = self.key()
        return [(kv.key[len(prefix):], data) for kv, data in reading.each_value(store.list(prefix), self.kind)]

    def create(self, store: Store, record: M) -> M:
        """Create-if-absent; Conflict when a record of that name exists."""
        record = cas.validated(self.model, record)
        name = getattr(record, self.name_field)
        if not store.create(self.key(name), record.model_dump_json()):
            raise Conflict(f"{self.kind} {name!r} already exists", code="already_exists")
        return record

    def put(self, store: Store, record: M) -> M:
        """Create or replace (for records whose writer owns them whole: sites, aliases, quotas)."""
        record = cas.validated(self.model, record)
        store.put(self.key(getattr(record, self.name_field)), record.model_dump_json())
        return record

    def update(self, store: Store, name: str, mutate: Callable[[M], M | None], busy: str = "") -> M:
        return cas.update(store, self.key(name), self.model, mutate, kind=self.kind, name=name, busy=busy)

    def upsert(self, store: Store, name: str, build: Callable[[M | None], M], busy: str = "") -> tuple[M, bool]:
        """CAS create-or-update: ``build(current or None)`` returns the record to write; (record,
        created). Contended when every try lost a race."""
        out: builtins.list = []

        def change(kv) -> str:
            current = None if kv is None else reading.one(self.model, kv, self.kind)
            out[:] = [cas.validated(self.model, build(current)), current is None]
            return out[0].model_dump_json()

        cas.swap(store, self.key(name), change, busy=busy)
        return out[0], out[1]

    def update_at(self, store: Store, name: str, mod_revision: int, mutate: Callable[[M], M]) -> bool:
        """One compare-and-swap against the revision the caller decided on (no retry: a changed
        record means decide again); False when the record changed since or is gone."""
        kv = store.get(self.key(name))
        if kv is None or kv.mod_revision != mod_revision:
            return False
        record = cas.validated(self.model, mutate(reading.one(self.model, kv, self.kind)))
        return store.cas(kv.key, record.model_dump_json(), mod_revision)

    def update_status(self, store: Store, name: str, **fields) -> M:
        """Set fields of the record's status (no write when they already hold those values)."""
        def mutate(record):
            status = record.status
            if all(getattr(status, k, None) == v for k, v in fields.items()):
                return None
            record.status = status.model_copy(update=fields)
            return record

        return self.update(store, name, mutate)

    def delete(self, store: Store, name: str) -> None:
        if not store.delete(self.key(name)):
            raise NotFound(f"{self.kind} {name!r} not found")

    def discard(self, store: Store, name: str, mod_revision: int | None = None) -> bool:
        """Delete if present (and, given ``mod_revision``, unchanged since read); True when deleted."""
        return store.delete(self.key(name), mod_revision=mod_revision)
