"""The event log: what happened to which resource, for people (`fabricctl ai events`).

Every create, delete and scale the API accepts is recorded here, and controllers record what
they do (placement, failures) through the same `record_event`. Events are stored one key each
under keyspace.events(), keyed by nanosecond time plus a random suffix so a prefix listing is
chronological and two fabricd processes never overwrite each other. The log is bounded: when it
grows past `keep` entries the oldest are deleted.
"""

from __future__ import annotations

import secrets
import time

from pydantic import BaseModel, Field

from common import keyspace
from common.store.base import Store

# Kinds the event log knows without having seen them; a filter on any other kind that no stored
# event carries is refused (`--kind bogus` is a typo, not an empty answer). Modules that record
# events of a new kind add it here.
KNOWN_KINDS = frozenset({"model", "profile", "deployment", "endpoint", "node", "key", "replica", "site",
                         "policy", "quota", "autoscaler", "rollout", "tenant", "job", "backup"})


def unknown_kind(store: Store, kind: str) -> str | None:
    """Why `kind` is not a kind to filter on, or None when it is one."""
    seen = {EventRecord.model_validate_json(kv.value).kind for kv in store.list(keyspace.events())}
    known = KNOWN_KINDS | seen
    if kind in known:
        return None
    return f"kind: unknown kind {kind!r}; one of {', '.join(sorted(known))}"


class EventRecord(BaseModel):
    time: float = Field(..., description="unix seconds")
    kind: str = Field(..., description="resource kind: model, profile, deployment, endpoint, ...")
    name: str = Field(..., description="resource name")
    action: str = Field(..., description="created, deleted, deleting, scaled, failed, ...")
    message: str = ""
    tenant: str | None = None


def event_key(now: float) -> str:
    return keyspace.events(f"{int(now * 1e9):020d}-{secrets.token_hex(4)}")


def record_event(
    store: Store,
    kind: str,
    name: str,
    action: str,
    message: str,
    *,
    tenant: str | None = None,
    keep: int = 1000,
    now: float | None = None,
) -> EventRecord:
    event = EventRecord(time=time.time() if now is None else now, kind=kind, name=name,
                        action=action, message=message, tenant=tenant)
    store.put(event_key(event.time), event.model_dump_json())
    _trim(store, keep)
    return event


def _trim(store: Store, keep: int) -> None:
    kvs = store.list(keyspace.events())
    for kv in kvs[: max(0, len(kvs) - keep)]:
        store.delete(kv.key)


def recent_events(
    store: Store, limit: int = 100, *, kind: str | None = None, name: str | None = None
) -> list[EventRecord]:
    """The newest `limit` events matching the filters, oldest first."""
    events = [EventRecord.model_validate_json(kv.value) for kv in store.list(keyspace.events())]
    matching = [e for e in events if (kind is None or e.kind == kind) and (name is None or e.name == name)]
    return matching[-limit:] if limit > 0 else []
