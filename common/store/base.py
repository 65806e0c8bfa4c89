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
    may come late and in several answers (etcd serves a watch from a past revision from its sync
    loop, every 100 ms and slower under load), so [] never says the caller is caught up.
  - ``follow`` is the watch kept open: a stream of the events under a prefix, each batch whole
    revisions, until the caller stops it. A Mirror streams its span with it; once the stream's
    last event is at a fetch's revision or later, it holds every change up to that revision.
  - ``changed_since(prefix, after, at)`` says, in one read, what a copy of the prefix taken at
    revision ``after`` is missing at revision ``at``: the keys written after ``after`` (their
    mod_revision is greater) and how many keys the prefix holds in all. Every other live key
    is one the copy already holds unchanged, so a copy that holds more keys than that count
    allows holds keys deleted since (common/store/mirror.py). etcd answers as of ``at`` exactly
    (a Range at that revision with min_mod_revision); a backend that keeps no old versions
    (SQLite) answers as of its current revision, never older than ``at``; ``Changes.revision``
    says which. An ``at`` older than the history the store keeps raises Conflict "compacted".
    ``start``/``end`` ask one range of the prefix: a large prefix is read in parts at once.
Transient failures (backend unreachable) raise common.errors.TransientError.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops: the most keys one put_all transaction holds


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
    create_revision: int = 0  # a put's key's create_revision where the store's stream says (etcd); 0: not said


@dataclass(frozen=True)
class Changes:
    """``Store.changed_since``'s answer, as of ``revision``."""

    revision: int
    kvs: list[KV]  # the keys under the prefix written after the revision asked about, sorted by key
    count: int  # every key under the prefix, written since or not


@dataclass(frozen=True)
class Lease:
    id: int
    ttl: int


def check_range(prefix: str, start: str | None, end: str | None) -> None:
    """Store.changed_since's ``start``/``end`` check: a ValueError for a bound outside the prefix."""
    for bound in (start, end):
        if bound is not None and not bound.startswith(prefix):
            raise ValueError(f"changed_since: {bound!r} is not under the prefix {prefix!r}")


def below_nothing(prefix: str, below: str) -> bool:
    """Store.delete_prefix's ``below`` check: True when the range is empty; a ValueError when
    ``below`` is outside the prefix."""
    if not below.startswith(prefix):
        raise ValueError(f"delete_prefix: below={below!r} is not under prefix {prefix!r}")
    return below == prefix


class Store(Protocol):
    def get(self, key: str) -> KV | None: ...

    def get_all(self, keys: builtins.list[str]) -> builtins.list[KV | None]:
        """Each key's KV (None where absent), in the order given: one read per MAX_TXN_OPS keys,
        not one per key (each batch at one revision)."""
        ...

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

    def delete_prefix(self, prefix: str, *, below: str | None = None) -> int:
        """Delete the keys under prefix (only those sorted before ``below`` when given; it must
        start with prefix: a ValueError otherwise), at one revision; how many."""
        ...

    def grant_lease(self, ttl: int) -> Lease: ...

    def refresh_lease(self, lease_id: int) -> bool:
        """Extend the lease by its TTL; False if it already expired."""
        ...

    def revoke_lease(self, lease_id: int) -> None: ...

    def revision(self) -> int:
        """The store's current revision."""
        ...

    def changed_since(self, prefix: str, after_revision: int, at_revision: int, *,
                      start: str | None = None, end: str | None = None) -> Changes:
        """The keys under prefix with mod_revision > after_revision and the count of all keys
        under it, as of at_revision (a revision the store has reached) or, where the backend
        keeps no old versions, as of its current revision (the module docstring). ``start`` and
        ``end`` (keys under the prefix) narrow both to the keys k with start <= k < end."""
        ...

    def watch(self, prefix: str, after_revision: int, timeout: float) -> builtins.list[Event]: ...

    def follow(self, prefix: str, after_revision: int, stop: threading.Event) -> Iterator[builtins.list[Event]]:
        """Every event under prefix after after_revision, in revision order, as the store has them:
        each list holds whole revisions (a revision's events never straddle two lists), so after
        a list every event through its last revision has been yielded. Runs until ``stop`` is
        set (seen within about a second); raises Conflict("compacted") when the history asked
        for is gone, TransientError when the store fails. One stream, not a call per change."""
        ...

    def close(self) -> None: ...
