"""Exact tenant GPU admission: one writer per tenant at a time, under a lock held on a lease.

A tenant's use is a sum over its deployment records, and the Store has no transaction that can
compare several records and write one, so check-then-write alone lets two creates (or scales)
of one tenant both pass. Every change that can add GPUs therefore runs inside
``tenant_admission``: it takes ``/fabric/locks/quota/{tenant}`` with create-if-absent on a lease
(common.store.locks.LeaseLock; STYLE.md rule 12), the caller reads the use fresh from the store,
checks, calls ``still_held`` and writes the deployment, and the lock is released. Deployment
create, manual scale (API and apply) and the autoscaler's scale-out all do this, on SQLite and
etcd alike. Deleting needs no lock: it only lowers the use, so a check running meanwhile can at
worst count GPUs about to be freed (it refuses, never over-admits).

A holder that dies gives the lock back when its lease expires (TTL); one stalled past its TTL
(by its own clock, with LeaseLock's safety margin) fails ``still_held`` and writes nothing.
A deployment without a tenant takes no lock. Waiting longer than ``wait_s`` for a busy tenant
is a 503 ``contended`` (retry), never a silent pass.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from common.errors import Contended
from common.store.base import Store
from common.store.locks import LeaseLock

LOCK_TTL_S = 10
WAIT_S = 5.0
POLL_S = 0.02


def lock_name(tenant: str) -> str:
    return f"quota/{tenant}"


@contextmanager
def tenant_admission(store: Store, tenant: str | None, *, wait_s: float = WAIT_S,
                     ttl: int = LOCK_TTL_S) -> Iterator[LeaseLock | None]:
    """Hold the tenant's admission lock for the body (None for a tenant-less deployment)."""
    if tenant is None:
        yield None
        return
    lock = LeaseLock(store, lock_name(tenant), holder=f"admission-{uuid.uuid4().hex[:12]}", ttl=ttl)
    deadline = time.monotonic() + wait_s
    while not lock.try_acquire():
        if time.monotonic() >= deadline:
            raise Contended(f"tenant {tenant!r} GPU admission is busy; try again")
        time.sleep(POLL_S)
    try:
        yield lock
    finally:
        lock.release()


def still_held(lock: LeaseLock | None) -> None:
    """Call right before the deployment write: a lock lost to a stall must not admit anything."""
    if lock is not None and not lock.held():
        raise Contended(f"lost the GPU admission lock {lock.name!r} before writing; try again")
