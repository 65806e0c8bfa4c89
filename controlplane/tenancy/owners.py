"""Whose is an object: the tenant of a model, profile, deployment, endpoint or key, from the store.

``check_owned`` is what an OWNED route rule (controlplane.tenancy.route_rules) runs before the
handler, for a tenant-bound caller only: a missing object and another tenant's object give the
same 404 with the same message, so a caller cannot tell them apart; a visible object it may not
change (the shared, tenant-less catalog) is 403 "shared_object". A key belongs to its own tenant,
else to its endpoint's. ``visible_tenant`` filters lists the same way.
"""

from __future__ import annotations

from collections.abc import Callable

from common import keyspace
from common.errors import Forbidden, NotFound, UnreadableRecord
from common.records import api_keys
from common.records.kinds import BY_KIND
from common.schemas import ApiKeyRecord
from common.store.base import Store
from controlplane.tenancy.principal import Principal, visible, writable

_MISSING = object()
KEYSPACES: dict[str, Callable[[str], str]] = {
    "model": keyspace.models, "profile": keyspace.profiles,
    "deployment": keyspace.deployments, "endpoint": keyspace.endpoints,
}


def record_tenant(store: Store, kind: str, name: str):
    """The stored object's ``tenant`` (None when it has none), or _MISSING."""
    if kind == "key":
        return _key_tenant(store, name)
    try:
        record = BY_KIND[kind].stored(store, name)
        return _MISSING if record is None else record.get("tenant")
    except UnreadableRecord:
        return _MISSING


def key_tenant(store: Store, record: ApiKeyRecord) -> str | None:
    if record.tenant is not None:
        return record.tenant
    tenant = record_tenant(store, "endpoint", record.endpoint)
    return None if tenant is _MISSING else tenant


def _key_tenant(store: Store, ref: str):
    try:
        record = api_keys.get(store, ref)  # the key records' one reader (common.records.api_keys)
    except NotFound:
        return _MISSING  # by name: the handler resolves among the caller's own keys (keys_for)
    return key_tenant(store, record)


def keys_for(store: Store, principal: Principal) -> list[ApiKeyRecord]:
    """The keys ``principal`` may see (all of them for a cluster-wide caller)."""
    records = api_keys.list(store)
    if not principal.bound:
        return records
    return [r for r in records if visible(principal, "key", key_tenant(store, r))]


def not_found(kind: str, ref: str) -> NotFound:
    if kind == "key":
        return NotFound(f"no key with id or name {ref!r}")
    return NotFound(f"{kind} {ref!r} not found")


def check_owned(store: Store, principal: Principal, kind: str, ref: str, *, write: bool) -> None:
    """Raise 404 unless ``principal`` may see the object; 403 when it may see but not change it."""
    if not principal.bound:
        return
    tenant = record_tenant(store, kind, ref)
    if tenant is _MISSING and kind == "key":
        named = [r for r in keys_for(store, principal) if r.name == ref]
        if not named:
            raise not_found(kind, ref)
        tenant = key_tenant(store, named[0])
    if tenant is _MISSING or not visible(principal, kind, tenant):
        raise not_found(kind, ref)
    if write and not writable(principal, tenant):
        raise Forbidden(f"{kind} {ref!r} is shared by every tenant; only a cluster-wide operator or admin "
                        "may change it", code="shared_object")


def visible_record(principal: Principal, kind: str) -> Callable[[dict], bool]:
    """A filter for stored JSON records of ``kind`` (lists)."""
    return lambda record: visible(principal, kind, record.get("tenant"))
