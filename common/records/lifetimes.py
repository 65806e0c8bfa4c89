"""The replica lifetime ledger (/fabric/replica-lifetimes/<replica_id>, the finops rows): when
each replica held its GPUs and when it was ready.

A replica's record disappears with the replica, so finops could only ever see the living ones.
Every write of a replica record (common.records.replicas.put) and every
deletion (replicas.delete) also updates ``/fabric/replica-lifetimes/{replica_id}``:

  created_at    the replica record's creation (its GPUs are reserved from then)
  ready_spans   [start, end] pairs; end None while it is ready now. A span opens at the record's
                ``ready_since`` (or the write's time) when it becomes ready, and closes when a
                write says not ready (or draining) or the replica is deleted
  ended_at      when the record was deleted (its GPUs are released then)
  gpus, deployment, tenant   what it held and for whom (tenant read from the deployment once)

Writes are compare-and-swap and only when something changes, so a steady replica costs one read
per write of its record. Lifetimes that ended more than RETENTION_S ago are pruned when finops
reads them. At most MAX_SPANS spans are kept per replica (the oldest two merge), so a flapping
replica cannot grow its record without bound.
Reads keep each record's revision, so a prune or an end-now writes only what it read.
"""

from __future__ import annotations

import builtins

from pydantic import BaseModel, Field

from common import keyspace
from common.errors import UnreadableRecord
from common.records import cas, deployments, reading
from common.records.resource import Records
from common.schemas import Replica
from common.store.base import KV, Store

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
    prefix = keyspace.replica_lifetimes()
    return [(kv.key[len(prefix):], life, kv.mod_revision) for kv, life in reading.pairs(Lifetime, store.list(prefix), KIND)]


def replace_at(store: Store, name: str, life: Lifetime, mod_revision: int) -> bool:
    """Write ``life`` as record ``name`` only if it is still at ``mod_revision``; False when it changed."""
    life = cas.validated(Lifetime, life)
    return store.cas(key(name), life.model_dump_json(), mod_revision)


RETENTION_S = 31 * 86400.0
MAX_SPANS = 256


def _tenant(store: Store, deployment: str) -> str | None:
    try:
        record = deployments.stored(store, deployment)
    except UnreadableRecord:
        return None
    return None if record is None else record.get("tenant")


def _open(life: Lifetime) -> bool:
    return bool(life.ready_spans) and life.ready_spans[-1][1] is None


def advance(life: Lifetime, replica: Replica | None, now: float) -> Lifetime:
    """Pure: the lifetime after a write of ``replica`` (None: the record was deleted) at ``now``."""
    spans = [list(s) for s in life.ready_spans]
    ready = replica is not None and replica.ready and not replica.draining
    if replica is not None and ready and not _open(life):
        start = replica.ready_since if replica.ready_since is not None else now
        prev_end = spans[-1][1] if spans else None
        spans.append([max(start, start if prev_end is None else prev_end, life.created_at), None])
    elif not ready and _open(life):
        first = spans[-1][0]
        spans[-1][1] = now if first is None else max(now, first)
    while len(spans) > MAX_SPANS:
        spans[0:2] = [[spans[0][0], spans[1][1]]]
    ended = now if replica is None and life.ended_at is None else life.ended_at
    gpus = len(replica.gpus) if replica is not None else life.gpus
    return life.model_copy(update={"ready_spans": spans, "ended_at": ended, "gpus": gpus})


def note(store: Store, replica: Replica | None, now: float, *, replica_id: str = "", deployment: str = "") -> None:
    """Record a write (``replica``) or the deletion (None, with ``replica_id``) of a replica."""
    rid = replica.replica_id if replica is not None else replica_id
    at = key(rid)

    def change(kv: KV | None) -> str | None:
        if kv is None:
            if replica is None:
                return None  # never recorded (a replica from before the ledger): nothing to close
            life = Lifetime(replica_id=rid, deployment=replica.deployment, tenant=_tenant(store, replica.deployment),
                            gpus=len(replica.gpus), created_at=replica.created_at)
            return advance(life, replica, now).model_dump_json()
        life = reading.one(Lifetime, kv, KIND)
        new = advance(life, replica, now)
        return None if new == life else new.model_dump_json()

    try:
        cas.swap(store, at, change)
    except cas.Contended:
        pass  # the ledger is best effort: the replica's next write tries again


def load(store: Store, now: float, live: set[str] | None = None) -> list[Lifetime]:
    """Every lifetime; those that ended more than RETENTION_S ago are deleted instead. With
    ``live`` (the replica ids whose records exist), a lifetime still open for a replica whose record
    is gone without a delete_replica (a store restored from a backup, a record removed by hand) is
    ended now, so it stops counting."""
    out = []
    for name, life, revision in versioned_list(store):
        if life.ended_at is not None and now - life.ended_at > RETENTION_S:
            discard(store, name, revision)
            continue
        if live is not None and life.ended_at is None and life.replica_id not in live:
            ended = advance(life, None, now)
            if replace_at(store, name, ended, revision):
                life = ended
        out.append(life)
    return out
