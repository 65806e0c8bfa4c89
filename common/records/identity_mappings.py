"""Identity mapping records (/fabric/identity-mappings/<name>, common.identity_mappings): typed
reads and validated writes; the gateway reads the same records through gateway.oidc_access."""

from __future__ import annotations

import builtins
from collections.abc import Callable

from common import keyspace
from common.errors import NotFound
from common.identity_mappings import IdentityMapping
from common.records import cas, reading
from common.store.base import Store

KIND = "identity mapping"


def get(store: Store, name: str) -> IdentityMapping | None:
    kv = store.get(keyspace.identity_mappings(name))
    return None if kv is None else reading.one(IdentityMapping, kv, KIND)


def require(store: Store, name: str) -> IdentityMapping:
    found = get(store, name)
    if found is None:
        raise NotFound(f"no identity mapping named {name!r}")
    return found


def list(store: Store) -> builtins.list[IdentityMapping]:  # noqa: A001 - the module's verb
    out = reading.each(IdentityMapping, store.list(keyspace.identity_mappings()), KIND)
    return sorted(out, key=lambda m: m.name)


def put(store: Store, mapping: IdentityMapping) -> IdentityMapping:
    """Create or replace (a mapping is one document: PUT semantics)."""
    mapping = IdentityMapping.model_validate(mapping.model_dump(), context={"stored": True})
    store.put(keyspace.identity_mappings(mapping.name), mapping.model_dump_json())
    return mapping


def update(store: Store, name: str, mutate: Callable[[IdentityMapping], IdentityMapping | None]) -> IdentityMapping:
    return cas.update(store, keyspace.identity_mappings(name), IdentityMapping, mutate, kind=KIND, name=name)


def delete(store: Store, name: str) -> None:
    if not store.delete(keyspace.identity_mappings(name)):
        raise NotFound(f"no identity mapping named {name!r}")
