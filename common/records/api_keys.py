"""API key records (/fabric/api-keys/<id>) and their two index keys: prefix -> id (the gateway's
lookup) and (endpoint, name) -> id (a name is unique per endpoint).

A new key is written with its index keys in one create-all transaction, so of concurrent creates
of one (endpoint, name) exactly one wins and a loser writes nothing; a name index entry whose key
record is gone (a delete that stopped half-way) is dropped and the create tried again on the one
loop (common.records.cas). A delete removes the record first (the key stops working), then each
index entry only while it still points at this id (never a successor's claim on the same name).
What a key is (its format, digest, rotation) is common.apikeys.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable

from common import keyspace
from common.errors import Conflict, InvalidInput, NotFound
from common.records import cas, reading
from common.schemas import ApiKeyRecord
from common.store.base import Store

KIND = "API key"


def index_items(record: ApiKeyRecord) -> builtins.list[tuple[str, str]]:
    """The index keys a record owns: prefix -> id and (endpoint, name) -> id."""
    return [(keyspace.api_key_prefixes(record.prefix), record.id),
            (keyspace.api_key_names(record.endpoint, record.name), record.id)]


def _drop_stale_name(store: Store, record: ApiKeyRecord) -> bool:
    """Remove a name index entry whose key record is gone; True if the name is free to claim again."""
    kv = store.get(keyspace.api_key_names(record.endpoint, record.name))
    if kv is None:
        return True
    if store.get(keyspace.api_keys(kv.value)) is not None:
        return False
    return store.delete(kv.key, mod_revision=kv.mod_revision) or store.get(kv.key) is None


def save_new(store: Store, record: ApiKeyRecord) -> None:
    """Write the record and both index keys at once. Conflict (already_exists) when the name is
    held, InvalidInput on a (random) prefix collision, Contended when every try lost a race."""
    items = [*index_items(record), (keyspace.api_keys(record.id), record.model_dump_json())]

    def attempt() -> bool | None:
        if store.create_all(items):
            return True
        if not _drop_stale_name(store, record):
            raise Conflict(f"endpoint {record.endpoint!r} already has a key named {record.name!r}; rotate or "
                           "delete it", code="already_exists")
        if store.get(keyspace.api_key_prefixes(record.prefix)) is not None:
            raise InvalidInput("key prefix collision; try again")
        return None  # a stale name entry went: claim it again

    cas.retry(attempt, f"key name {record.name!r} is being changed concurrently; try again")


def get(store: Store, key_id: str) -> ApiKeyRecord:
    """The key's record; NotFound when absent."""
    kv = store.get(keyspace.api_keys(key_id))
    if kv is None:
        raise NotFound(f"API key {key_id!r} does not exist")
    return reading.one(ApiKeyRecord, kv, KIND)


def find_by_prefix(store: Store, prefix: str) -> ApiKeyRecord | None:
    """The record a key's prefix indexes; None when no key has it."""
    kv = store.get(keyspace.api_key_prefixes(prefix))
    rec = None if kv is None else store.get(keyspace.api_keys(kv.value))
    return None if rec is None else reading.one(ApiKeyRecord, rec, KIND)


def list(store: Store) -> builtins.list[ApiKeyRecord]:  # noqa: A001 - the module's verb
    return reading.each(ApiKeyRecord, store.list(keyspace.api_keys()), KIND)


def update(store: Store, key_id: str, mutate: Callable[[ApiKeyRecord], ApiKeyRecord | None]) -> ApiKeyRecord:
    """Compare-and-swap ``mutate`` onto the key's record (a rotation, a renewal)."""
    try:
        return cas.update(store, keyspace.api_keys(key_id), ApiKeyRecord, mutate, kind=KIND, name=key_id,
                          busy=f"API key {key_id!r} is being changed concurrently; try again")
    except NotFound:
        raise NotFound(f"API key {key_id!r} does not exist") from None


def delete(store: Store, key_id: str) -> None:
    """The record first (the key stops working), then its index entries that still point at it."""
    record = get(store, key_id)
    store.delete(keyspace.api_keys(key_id))
    for key, owner in index_items(record):
        kv = store.get(key)
        if kv is not None and kv.value == owner:
            store.delete(key, mod_revision=kv.mod_revision)
