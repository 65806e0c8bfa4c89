"""Playground-key slots (/fabric/playground-slots/{endpoint}/{owner}/{i}): how a caller's count of
live playground keys on an endpoint stays bounded (controlplane.ops.keys.create_playground).

Each key takes one of the caller's ``count`` slots with create-if-absent under a store lease that
outlives the key a little, so concurrent creates cannot all pass the count. Once the key is made
the slot names it (``hold``), so revoking the key frees its slot (``free``); expiry lets the lease
drop it. Each slot has a lease of its own, revoked when the slot is freed or given back, so a loop
of creates and revokes leaves no lease behind. ``owner`` in the key is a hash of the caller's name, never the name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from common import keyspace
from common.store.base import Store

LEASE_MARGIN_S = 60  # a slot outlives its key by this much


@dataclass(frozen=True)
class Slot:
    key: str
    lease: int


def _prefix(endpoint: str, subject: str) -> str:
    return keyspace.playground_slots(endpoint, hashlib.sha256(subject.encode()).hexdigest()[:32])


def take(store: Store, endpoint: str, subject: str, count: int, ttl_s: int) -> Slot | None:
    """One of ``subject``'s ``count`` slots on ``endpoint``, taken atomically under a lease of
    ``ttl_s`` + LEASE_MARGIN_S; None when all are held."""
    lease = store.grant_lease(ttl_s + LEASE_MARGIN_S)
    prefix = _prefix(endpoint, subject)
    for key in [f"{prefix}{i}" for i in range(count)]:  # each slot once: a free one, not a retry
        if store.create(key, "", lease=lease.id):
            return Slot(key, lease.id)
    store.revoke_lease(lease.id)
    return None


def hold(store: Store, slot: Slot, key_id: str) -> None:
    """The slot names the key made in it (under its lease), so revoking the key frees it."""
    store.put(slot.key, key_id, lease=slot.lease)


def give_back(store: Store, slot: Slot) -> None:
    """The slot is free again (no key was made in it): its lease goes, and the slot with it."""
    store.revoke_lease(slot.lease)


def free(store: Store, endpoint: str, key_ids: set[str], subject: str | None = None) -> None:
    """Free the slots on ``endpoint`` (of ``subject`` only, when given) that name one of ``key_ids``:
    each slot's own lease is revoked, so no lease outlives its slot."""
    prefix = _prefix(endpoint, subject) if subject is not None else keyspace.playground_slots(endpoint)
    for kv in store.list(prefix):
        if kv.value in key_ids:
            if kv.lease:
                store.revoke_lease(kv.lease)
            else:
                store.delete(kv.key)
