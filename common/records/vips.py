"""VIP allocations (/fabric/vips/<address>): taken with create-if-absent (controlplane.placement.vip_pool picks
the address) so two endpoints never hold one VIP, released only by the endpoint that holds it. A
value is JSON {endpoint, allocated_at}. A get of one that does not parse raises (the door's parse
policy); in the listing and on release it has no owner, and is counted (common.records.reading)."""

from __future__ import annotations

from pydantic import BaseModel

from common import keyspace
from common.records import cas, reading
from common.store.base import KV, Store

KIND = "VIP allocation"


class VipAllocation(BaseModel):
    endpoint: str
    allocated_at: float = 0.0


def _owner(kv: KV | None) -> str | None:
    if kv is None:
        return None
    try:
        return reading.parse(VipAllocation, kv.value).endpoint
    except ValueError:
        reading.skipped(KIND, kv.key)
        return None


def owner(store: Store, address: str) -> str | None:
    """The endpoint holding ``address``, or None when free (UnreadableRecord when it does not parse)."""
    kv = store.get(keyspace.vips(address))
    return None if kv is None else reading.one(VipAllocation, kv, KIND).endpoint


def owners(store: Store) -> dict[str, str]:
    """address -> owning endpoint for every allocated VIP ('' for a value that does not parse)."""
    prefix = keyspace.vips()
    return {kv.key[len(prefix):]: _owner(kv) or "" for kv in store.list(prefix)}


def claim(store: Store, address: str, endpoint: str, now: float) -> bool:
    """Take ``address`` for ``endpoint`` with create-if-absent; False when someone holds it."""
    record = cas.validated(VipAllocation, VipAllocation(endpoint=endpoint, allocated_at=now))
    return store.create(keyspace.vips(address), record.model_dump_json())


def release(store: Store, address: str, endpoint: str) -> bool:
    """Free the address only if this endpoint still holds it; True if a key was deleted."""
    kv = store.get(keyspace.vips(address))
    if kv is None or _owner(kv) != endpoint:
        return False
    return store.delete(kv.key, mod_revision=kv.mod_revision)
