"""``Records``: the five verbs of one resource kept as pydantic JSON at one keyspace path. Each
resource's module (deployments.py, endpoints.py, ...) binds one and exports its verbs, so every
kind reads, validates and compare-and-swaps the same way.

``stored``/``stored_list`` answer the JSON exactly as it was written (the API's reads return it as
is, so a record stays readable whatever was added to its model since); everything else is typed."""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable
from typing import Generic

from common.errors import Conflict, NotFound
from common.records import cas
from common.records.cas import M
from common.store.base import Store


def readable_values(store: Store, prefix: str) -> list[dict]:
    """The JSON values under ``prefix``; values that are not JSON are skipped."""
    out = []
    for kv in store.list(prefix):
        try:
            out.append(json.loads(kv.value))
        except ValueError:
            continue
    return out


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
        return None if kv is None else cas.parse(self.model, kv.value)

    def versioned(self, store: Store, name: str) -> tuple[M, int] | None:
        """(record, mod_revision), for a caller that deletes only what it read (discard's mod_revision)."""
        kv = store.get(self.key(name))
        return None if kv is None else (cas.parse(self.model, kv.value), kv.mod_revision)

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
        return None if kv is None else json.loads(kv.value)

    def readable(self, store: Store) -> builtins.list[dict]:
        """Every record as stored that parses as a JSON object's text; the rest are skipped (for
        reports that must answer whatever one record holds)."""
        return readable_values(store, self.key())

    def list(self, store: Store) -> builtins.list[M]:
        return [cas.parse(self.model, kv.value) for kv in store.list(self.key())]

    def stored_items(self, store: Store) -> builtins.list[tuple[str, dict]]:
        """(name, JSON as stored) of every record, in key order."""
        prefix = self.key()
        return [(kv.key[len(prefix):], json.loads(kv.value)) for kv in store.list(prefix)]

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
            current = None if kv is None else cas.parse(self.model, kv.value)
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
        record = cas.validated(self.model, mutate(cas.parse(self.model, kv.value)))
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
