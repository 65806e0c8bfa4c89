"""Replica lifetime records (/fabric/replica-lifetimes/<replica_id>): the finops ledger's rows
(controlplane.tenancy.lifetimes says what they mean and when they change). Reads keep each
record's revision, so a prune or an end-now writes only what it read."""

from __future__ import annotations

import builtins

from pydantic import BaseModel, Field, ValidationError

from common import keyspace
from common.store.base import Store
from controlplane.records import cas
from controlplane.records.resource import Records

KIND = "replica lifetime"


class Lifetime(BaseModel):
    replica_id: str
    deployment: str
    tenant: str | None = None
    gpus: int = 0
    created_at: float
    ready_spans: list[list[float | None]] = Field(default_factory=list)
    ended_at: float | None = None


RECORDS = Records(Lifetime, keyspace.replica_lifetimes, KIND, name_field="replica_id")
key, discard = RECORDS.key, RECORDS.discard


def versioned_list(store: Store) -> builtins.list[tuple[str, Lifetime, int]]:
    """(name under the prefix, lifetime, mod_revision) of every record that parses, in key order."""
    prefix, out = keyspace.replica_lifetimes(), []
    for kv in store.list(prefix):
        try:
            out.append((kv.key[len(prefix):], cas.parse(Lifetime, kv.value), kv.mod_revision))
        except ValidationError:
            continue
    return out


def replace_at(store: Store, name: str, life: Lifetime, mod_revision: int) -> bool:
    """Write ``life`` as record ``name`` only if it is still at ``mod_revision``; False when it changed."""
    life = cas.validated(Lifetime, life)
    return store.cas(key(name), life.model_dump_json(), mod_revision)
