"""The audit chain's keys in the store: its entries (``keyspace.audit("<first row, 12 digits>")``,
each taken with create-if-absent so no two writers share a number) and its tip hint
(``keyspace.audit("tip")``: "<last row> <its entry's hash>", which may lag, never lead).

Values are the chain's own text (common.audit_chain seals, parses and verifies them); this module
only reads and writes them.
"""

from __future__ import annotations

from common import keyspace
from common.store.base import Store

TIP = "tip"


def entry_key(first: int) -> str:
    return keyspace.audit(f"{first:012d}")


def claim(store: Store, first: int, value: str) -> bool:
    """Write the entry starting at row ``first`` if no writer has taken that number."""
    return store.create_all([(entry_key(first), value)])


def entry(store: Store, first: int) -> str | None:
    """The entry starting at row ``first`` (its text), or None."""
    kv = store.get(entry_key(first))
    return None if kv is None else kv.value


def entries(store: Store) -> list[tuple[str, str]]:
    """(key, text) of every entry, in key order (the tip hint left out)."""
    return [(kv.key, kv.value) for kv in store.list(keyspace.audit()) if not kv.key.endswith("/" + TIP)]


def tip(store: Store) -> str | None:
    kv = store.get(keyspace.audit(TIP))
    return None if kv is None else kv.value


def put_tip(store: Store, value: str) -> None:
    store.put(keyspace.audit(TIP), value)
