"""MIG slice records (/fabric/mig-slices/<node>/<slice id>, common.mig_catalog.MigSlice):
typed reads and validated writes."""

from __future__ import annotations

import builtins

from common import keyspace
from common.mig_catalog import MigSlice
from common.records import cas, reading
from common.store.base import Store


def versioned(store: Store, node: str, slice_id: str) -> tuple[MigSlice, int] | None:
    """(slice, mod_revision), for a delete of exactly what was read."""
    kv = store.get(keyspace.mig_slices(node, slice_id))
    return None if kv is None else (reading.one(MigSlice, kv, "MIG slice"), kv.mod_revision)


def list(store: Store, node: str) -> builtins.list[MigSlice]:  # noqa: A001 - the module's verb
    return reading.each(MigSlice, store.list(keyspace.mig_slices(node, "")), "MIG slice")


def create(store: Store, slice_: MigSlice) -> bool:
    """Create-if-absent; False when a slice of that id exists on the node."""
    slice_ = cas.validated(MigSlice, slice_)
    return store.create(keyspace.mig_slices(slice_.node, slice_.id), slice_.model_dump_json())


def discard(store: Store, node: str, slice_id: str, mod_revision: int | None = None) -> bool:
    return store.delete(keyspace.mig_slices(node, slice_id), mod_revision=mod_revision)
