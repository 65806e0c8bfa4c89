"""Leader election and exclusive locks on any Store: a key taken with create-if-absent on a lease.

    lock = LeaseLock(store, "placement", holder="fabricd-1", ttl=15)
    if lock.held() or lock.try_acquire():
        if lock.keep_alive():          # every <= ttl/3 seconds
            do_leader_work(fence=lock.fence)
    ...
    lock.release()

Why it is safe:
  - The key ``/fabric/locks/{name}`` is created only if absent, so one holder at a time.
  - It lives on the holder's lease: a holder that dies or stalls loses it after the TTL.
  - ``held()`` is also bounded by the local clock: a holder counts itself leader only until
    ``ttl - margin`` seconds after the start of its last successful refresh, which is never later
    than when the store can expire the lease. A paused process therefore stops believing it leads
    before anyone else can take over.
  - ``fence`` is the lock key's create_revision: it grows with every new holder, so a write
    tagged with it can be told apart from a stale leader's. The Store protocol has no multi-key
    transaction, so fencing a write atomically is not possible here; check ``held()`` right
    before each write and keep the writes idempotent.

``FencedStore(store, lock)`` does that check for every write: a leader hands it to its workers
instead of the store, and a write attempted while ``lock.held()`` is false raises ``LeaseLost``
and writes nothing. ``LeaseLost`` is deliberately not a FabricError: the per-item
``except FabricError`` handlers of a pass (which record an error status, itself a write) must
not absorb it; it ends the whole pass, and the loop retries leadership.
(Exact counters live in common/records/counters.py.)
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from common import keyspace
from common.errors import NotFound
from common.store.base import KV, Changes, Event, Lease, Store

SAFETY_MARGIN = 0.2  # fraction of the TTL kept back for clock drift and request latency


class LeaseLost(Exception):
    """A leader-only write (or agent call) was attempted while this process does not hold the
    lock: its lease expired, was taken over, or was never held. Nothing was written."""


@dataclass(frozen=True)
class LockView:
    """Who holds a lock, as read from the store."""

    name: str
    holder: str | None
    fence: int | None


def lock_view(store: Store, name: str) -> LockView:
    kv = store.get(keyspace.locks(name))
    return LockView(name, kv.value if kv else None, kv.create_revision if kv else None)


def still_ours(kv: KV | None, holder: str, fence: int | None, lease_id: int | None) -> bool:
    """Pure check: the lock key is the one we created (same creation, same lease, our name)."""
    return (
        kv is not None
        and fence is not None
        and kv.create_revision == fence
        and kv.value == holder
        and kv.lease == lease_id
    )


class LeaseLock:
    """One process's handle on a named lock; not shared between threads without a lock."""

    def __init__(self, store: Store, name: str, holder: str, ttl: int = 15):
        self.store = store
        self.name = name
        self.key = keyspace.locks(name)
        self.holder = holder
        self.ttl = ttl
        self.lease_id: int | None = None
        self.fence: int | None = None
        self._valid_until = 0.0

    def held(self) -> bool:
        """True while we hold the lock by our own clock (see the module docstring)."""
        return self.fence is not None and time.monotonic() < self._valid_until

    def check(self, what: str = "write") -> None:
        """Raise LeaseLost unless ``held()``: call right before a leader-only side effect."""
        if not self.held():
            raise LeaseLost(f"{self.holder} no longer holds lock {self.name!r}; skipped {what}")

    def try_acquire(self) -> bool:
        started = time.monotonic()
        lease = self.store.grant_lease(self.ttl)
        try:
            created = self.store.create(self.key, self.holder, lease=lease.id)
        except BaseException:
            self.store.revoke_lease(lease.id)
            raise
        if not created:
            self.store.revoke_lease(lease.id)
            return False
        kv = self.store.get(self.key)
        if kv is None or not still_ours(kv, self.holder, kv.create_revision, lease.id):
            self.store.revoke_lease(lease.id)
            return False
        self.lease_id, self.fence = lease.id, kv.create_revision
        self._valid_until = started + self.ttl * (1 - SAFETY_MARGIN)
        return True

    def keep_alive(self) -> bool:
        """Refresh the lease and confirm the key is still ours; False means leadership is lost."""
        if self.lease_id is None:
            return False
        started = time.monotonic()
        try:
            refreshed = self.store.refresh_lease(self.lease_id)
        except NotFound:
            refreshed = False
        if refreshed and still_ours(self.store.get(self.key), self.holder, self.fence, self.lease_id):
            self._valid_until = started + self.ttl * (1 - SAFETY_MARGIN)
            return True
        self._forget()
        return False

    def release(self) -> None:
        """Give the lock up: delete only our own key (never a successor's), then drop the lease."""
        if self.lease_id is None:
            return
        kv = self.store.get(self.key)
        if kv is not None and still_ours(kv, self.holder, self.fence, self.lease_id):
            self.store.delete(self.key, mod_revision=kv.mod_revision)
        self.store.revoke_lease(self.lease_id)
        self._forget()

    def _forget(self) -> None:
        self.lease_id, self.fence, self._valid_until = None, None, 0.0


class FencedStore:
    """A Store whose writes happen only while ``lock.held()``; reads pass straight through.

    The check runs right before each write, so a leader whose lease lapsed mid-pass stops at
    its next write. Leases granted through it are the caller's own business (not fenced)."""

    def __init__(self, store: Store, lock: LeaseLock):
        self.inner = store
        self.lock = lock

    # reads
    def get(self, key: str) -> KV | None:
        return self.inner.get(key)

    def get_all(self, keys: builtins.list[str]) -> builtins.list[KV | None]:
        return self.inner.get_all(keys)

    def list(self, prefix: str) -> list[KV]:
        return self.inner.list(prefix)

    def revision(self) -> int:
        return self.inner.revision()

    def changed_since(self, prefix: str, after_revision: int, at_revision: int, *,
                      start: str | None = None, end: str | None = None) -> Changes:
        return self.inner.changed_since(prefix, after_revision, at_revision, start=start, end=end)

    def watch(self, prefix: str, after_revision: int, timeout: float) -> builtins.list[Event]:
        return self.inner.watch(prefix, after_revision, timeout)

    def follow(self, prefix: str, after_revision: int, stop: threading.Event) -> Iterator[builtins.list[Event]]:
        return self.inner.follow(prefix, after_revision, stop)

    # fenced writes
    def put(self, key: str, value: str, *, lease: int | None = None) -> int:
        self.lock.check(f"put {key}")
        return self.inner.put(key, value, lease=lease)

    def create(self, key: str, value: str, *, lease: int | None = None) -> bool:
        self.lock.check(f"create {key}")
        return self.inner.create(key, value, lease=lease)

    def create_all(self, items: builtins.list[tuple[str, str]]) -> bool:
        self.lock.check(f"create {len(items)} keys")
        return self.inner.create_all(items)

    def put_all(self, items: builtins.list[tuple[str, str]]) -> int:
        self.lock.check(f"put {len(items)} keys")
        return self.inner.put_all(items)

    def cas(self, key: str, value: str, mod_revision: int, *, lease: int | None = None) -> bool:
        self.lock.check(f"cas {key}")
        return self.inner.cas(key, value, mod_revision, lease=lease)

    def delete(self, key: str, *, mod_revision: int | None = None) -> bool:
        self.lock.check(f"delete {key}")
        return self.inner.delete(key, mod_revision=mod_revision)

    def delete_prefix(self, prefix: str, *, below: str | None = None) -> int:
        self.lock.check(f"delete_prefix {prefix}")
        return self.inner.delete_prefix(prefix, below=below)

    # leases: not leader state
    def grant_lease(self, ttl: int) -> Lease:
        return self.inner.grant_lease(ttl)

    def refresh_lease(self, lease_id: int) -> bool:
        return self.inner.refresh_lease(lease_id)

    def revoke_lease(self, lease_id: int) -> None:
        self.inner.revoke_lease(lease_id)

    def close(self) -> None:
        """The store belongs to whoever opened it; closing the fenced view does nothing."""
