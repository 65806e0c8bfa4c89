"""Records as uninterpreted text, for the one caller that must not interpret them: backup and
restore (controlplane.backup), which copy whole keyspaces as they are, whatever their kind and
whether or not they parse. Everything else reads and writes through its kind's module (the door
test allows only controlplane/backup/ to import this one).

``snapshot`` is every key under /fabric/ read in one range (one revision), leaving out keys held
under a lease (leader locks, live holders, agents' presence: they belong to processes, not to the
cluster's state). ``load_empty`` writes a snapshot back with create-if-absent in transactions of
at most BATCH keys, so a key that appeared meanwhile stops the restore instead of being overwritten.
"""

from __future__ import annotations

from common import keyspace
from common.store.base import Store

BATCH = 64  # keys per create-all transaction (under etcd's default --max-txn-ops, 128)


def snapshot(store: Store) -> list[tuple[str, str]]:
    """(key, value) of every key under /fabric/ not held under a lease, at one revision."""
    return [(kv.key, kv.value) for kv in store.list(keyspace.ROOT + "/") if not kv.lease]


def held(store: Store) -> int:
    """How many keys the store holds under /fabric/ (a restore writes only into an empty one)."""
    return len(store.list(keyspace.ROOT + "/"))


def items(store: Store, prefix: str) -> list[tuple[str, str]]:
    """(key, value) of every key under ``prefix``, in key order."""
    return [(kv.key, kv.value) for kv in store.list(prefix)]


def value(store: Store, key: str) -> str | None:
    kv = store.get(key)
    return None if kv is None else kv.value


def create(store: Store, key: str, text: str) -> bool:
    """Write ``text`` at ``key`` if it is absent; True when this call wrote it."""
    return store.create(key, text)


def put(store: Store, key: str, text: str) -> None:
    store.put(key, text)


def load_empty(store: Store, pairs: list[tuple[str, str]]) -> tuple[str, str] | None:
    """Create every key of ``pairs``, BATCH at a time; None when all were written, else the first
    and last key of the batch that found one of its keys already there (nothing of it written)."""
    batches = [pairs[i:i + BATCH] for i in range(0, len(pairs), BATCH)]
    for batch in batches:
        if not store.create_all(batch):
            return batch[0][0], batch[-1][0]
    return None
