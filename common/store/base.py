"""The store contract every backend meets (tests/common/test_store_contract.py runs it on both).

Semantics (etcd's, so the SQLite backend can be swapped for etcd without surprises):
  - Keys are str paths like ``/fabric/models/qwen``; values are str (JSON text by convention).
  - Every write bumps one store-wide revision; each KV carries the revision of its last write
    (``mod_revision``) and of its creation (``create_revision``).
  - ``create`` is create-if-absent: exactly one of many concurrent callers wins. Exclusive things
    (GPU reservations, VIPs, leader locks) are taken this way.
  - ``cas`` writes only when the key's current mod_revision equals the one given; it is how
    counters and read-modify-write updates stay exact under several processes.
  - ``create_all`` creates several absent keys in one transaction at one revision, or none of
    them (an etcd txn; one SQLite transaction): how the audit writer appends a batch of rows
    with one commit instead of one per row.
  - ``put_all`` writes several keys unconditionally in as few transactions as the backend allows
    (SQLite: one; etcd: one txn per MAX_TXN_OPS keys, etcd's default --max-txn-ops), each
    transaction at one revision: how a pass stores its changed observations with one round trip
    instead of one per replica.
  - A key attached to a lease disappears when the lease expires (TTL seconds without refresh)
    or is revoked.
  - ``watch`` long-polls: it returns the events under a prefix with revision > after_revision,
    blocking up to ``timeout`` seconds for the first one; [] on timeout. History already written
    may take a backend's ``history_wait_s`` to come, in several answers (etcd: its sync loop runs
    every 100 ms); 0 says it comes at once, all in one answer (SQLite's events table).
Transient failures (backend unreachable) raise common.errors.TransientError.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Literal, Protocol

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops: the most keys one put_all transaction holds
HISTORY_WAIT_S = 0.2  # for a backend that does not say its history_wait_s


def history_wait_s(store: object) -> float:
    """How long a watch from a past revision may wait for history already written (the module
    docstring); a wrapper passes its inner store's on."""
    return float(getattr(store, "history_wait_s", HISTORY_WAIT_S))


@dataclass(frozen=True)
class KV:
    key: str
    value: str
    mod_revision: int
    create_revision: int
    lease: int | None = None


@dataclass(frozen=True)
class Event:
    type: Literal["put", "delete"]
    key: str
    value: str | None
    revision: int


@dataclass(frozen=True)
class Lease:
    id: int
    ttl: int


class Store(Protocol):
    def get(self, key: str) -> KV | None: ...

    def list(self, prefix: str) -> list[KV]:
        """All live keys starting with prefix, sorted by key."""
        ...

    def put(self, key: str, value: str, *, lease: int | None = None) -> int:
        """Unconditional write; returns the new revision."""
        ...

    def create(self, key: str, value: str, *, lease: int | None = None) -> bool:
        """Write only if the key is absent; True if this call created it."""
        ...

    def cas(self, key: str, value: str, mod_revision: int, *, lease: int | None = None) -> bool:
        """Write only if the key exists with this mod_revision; True on success."""
        ...

    def create_all(self, items: builtins.list[tuple[str, str]]) -> bool:
        """Create every (key, value) if none of the keys exists, at one revision; else write
        nothing and return False."""
        ...

    def put_all(self, items: builtins.list[tuple[str, str]]) -> int:
        """Write every (key, value) (distinct keys) unconditionally, MAX_TXN_OPS keys per transaction (each at one
        revision); returns the last revision written (the current one when items is empty)."""
        ...

    def delete(self, key: str, *, mod_revision: int | None = None) -> bool:
        """Delete (only at this mod_revision when given); True if a key was deleted."""
        ...

    def delete_prefix(self, prefix: str) -> int: ...

    def grant_lease(self, ttl: int) -> Lease: ...

    def refresh_lease(self, lease_id: int) -> bool:
        """Extend the lease by its TTL; False if it already expired."""
        ...

    def revoke_lease(self, lease_id: int) -> None: ...

    def revision(self) -> int:
        """The store's current revision."""
        ...

    def watch(self, prefix: str, after_revision: int, timeout: float) -> builtins.list[Event]: ...

    def close(self) -> None: ...
