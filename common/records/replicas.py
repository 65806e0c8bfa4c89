"""Replica records (/fabric/replicas/<deployment>/<replica_id>): typed reads and writes. A write or
delete also moves the replica's lifetime ledger entry (common.records.lifetimes)."""

from __future__ import annotations

import builtins
import time

from pydantic import ValidationError

from common import keyspace
from common.records import cas, lifetimes
from common.records.resource import readable_values
from common.schemas import Replica
from common.store.base import Store


def get(store: Store, deployment: str, replica_id: str) -> Replica | None:
    """The replica; None when absent or unreadable (the loops skip a record they cannot parse)."""
    kv = store.get(keyspace.replicas(deployment, replica_id))
    try:
        return None if kv is None else cas.parse(Replica, kv.value)
    except ValidationError:
        return None


def list(store: Store, deployment: str | None = None) -> builtins.list[Replica]:  # noqa: A001 - the module's verb
    """Every replica, or one deployment's."""
    prefix = keyspace.replicas(deployment, "") if deployment else keyspace.replicas()
    return [cas.parse(Replica, kv.value) for kv in store.list(prefix)]


def readable(store: Store) -> builtins.list[dict]:
    """Every replica record as stored that is JSON (unreadable ones skipped)."""
    return readable_values(store, keyspace.replicas())


def put(store: Store, replica: Replica, now: float | None = None) -> None:
    """Write a replica record; its lifetime ledger entry follows."""
    store.put(keyspace.replicas(replica.deployment, replica.replica_id), replica.model_dump_json())
    lifetimes.note(store, replica, time.time() if now is None else now)


def delete(store: Store, deployment: str, replica_id: str, now: float | None = None) -> None:
    """Delete a replica record and end its lifetime (its GPUs are released with it)."""
    store.delete(keyspace.replicas(deployment, replica_id))
    lifetimes.note(store, None, time.time() if now is None else now, replica_id=replica_id)
