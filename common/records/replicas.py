"""Replica records (/fabric/replicas/<deployment>/<replica_id>): typed reads and writes. A write or
delete also moves the replica's lifetime ledger entry (common.records.lifetimes)."""

from __future__ import annotations

import builtins
import time

from common import keyspace
from common.records import lifetimes, reading
from common.records.resource import readable_values
from common.schemas import Replica
from common.store.base import Store

KIND = "replica"


def get(store: Store, deployment: str, replica_id: str) -> Replica | None:
    """The replica; None when absent (UnreadableRecord when it does not parse)."""
    kv = store.get(keyspace.replicas(deployment, replica_id))
    return None if kv is None else reading.one(Replica, kv, KIND)


def get_all(store: Store, ids: builtins.list[tuple[str, str]]) -> builtins.list[Replica | None]:
    """Each (deployment, replica_id)'s replica, None where absent, in one read per MAX_TXN_OPS
    (UnreadableRecord when one does not parse)."""
    kvs = store.get_all([keyspace.replicas(d, r) for d, r in ids])
    return [None if kv is None else reading.one(Replica, kv, KIND) for kv in kvs]


def list(store: Store, deployment: str | None = None) -> builtins.list[Replica]:  # noqa: A001 - the module's verb
    """Every replica that parses, or one deployment's (the rest skipped and counted)."""
    prefix = keyspace.replicas(deployment, "") if deployment else keyspace.replicas()
    return reading.each(Replica, store.list(prefix), KIND)


def readable(store: Store) -> builtins.list[dict]:
    """Every replica record as stored that is a JSON object (the rest skipped and counted)."""
    return readable_values(store, keyspace.replicas(), KIND)


def put(store: Store, replica: Replica, now: float | None = None) -> None:
    """Write a replica record; its lifetime ledger entry follows."""
    store.put(keyspace.replicas(replica.deployment, replica.replica_id), replica.model_dump_json())
    lifetimes.note(store, replica, time.time() if now is None else now)


def delete(store: Store, deployment: str, replica_id: str, now: float | None = None) -> None:
    """Delete a replica record and end its lifetime (its GPUs are released with it)."""
    store.delete(keyspace.replicas(deployment, replica_id))
    lifetimes.note(store, None, time.time() if now is None else now, replica_id=replica_id)
