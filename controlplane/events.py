"""The event log: what happened to which object and why, for people (`fabricctl ai events`).

Every create, delete and scale the API accepts is recorded here, and the controllers record
what they decide and what fails (placement, replica lifecycle, VIPs, weight changes, scaling,
quota refusals, agent errors) through the same ``record_event``. An event names its object by
``kind`` and ``name`` (``object`` is "kind/name"), says why in ``reason`` (the stored ``action``:
created, ReplicaReady, ProbeFailed, ScaledOut, QuotaRefused, ...), how bad in ``type`` (Normal
or Warning) and what in ``message``.

Events are stored one key each under keyspace.events(), keyed by nanosecond time plus a random
suffix, so a prefix listing is chronological and two fabricd processes never overwrite each
other. The log is bounded on every store: each write drops the oldest events beyond ``keep``
(FABRIC_EVENTS_KEPT, 1000) and those older than ``max_age_s`` (FABRIC_EVENTS_MAX_AGE_SECS,
7 days). Controllers rate-limit themselves (one event per change, never per tick).
"""

from __future__ import annotations

import time

from common.records import events as event_records
from common.records.events import EventRecord, event_key
from common.store.base import Store

__all__ = ["DEFAULT_MAX_AGE_S", "KNOWN_KINDS", "EventRecord", "EventSink", "event_key", "matches_object",
           "recent_events", "record_event", "trim", "unknown_kind"]

DEFAULT_MAX_AGE_S = 7 * 86400.0

# Kinds the event log knows without having seen them; a filter on any other kind that no stored
# event carries is refused (`--kind bogus` is a typo, not an empty answer). Modules that record
# events of a new kind add it here.
KNOWN_KINDS = frozenset({"model", "profile", "deployment", "endpoint", "node", "key", "replica", "site",
                         "policy", "quota", "autoscaler", "rollout", "tenant", "job", "backup"})


def unknown_kind(store: Store, kind: str) -> str | None:
    """Why `kind` is not a kind to filter on, or None when it is one."""
    known = KNOWN_KINDS | event_records.kinds(store)
    if kind in known:
        return None
    return f"kind: unknown kind {kind!r}; one of {', '.join(sorted(known))}"


def record_event(
    store: Store,
    kind: str,
    name: str,
    action: str,
    message: str,
    *,
    tenant: str | None = None,
    keep: int = 1000,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    now: float | None = None,
    type: str = "Normal",
) -> EventRecord:
    event = EventRecord(time=time.time() if now is None else now, kind=kind, name=name,
                        action=action, message=message, tenant=tenant, type=type)
    event_records.append(store, event)
    trim(store, keep, max_age_s, now=event.time)
    return event


def trim(store: Store, keep: int, max_age_s: float = DEFAULT_MAX_AGE_S, *, now: float | None = None) -> int:
    """Delete events beyond the newest ``keep`` and those older than ``max_age_s``; how many."""
    now = time.time() if now is None else now
    return event_records.trim(store, keep, now - max_age_s)


def matches_object(event: EventRecord, obj: str) -> bool:
    """``obj`` is a name ("qwen-0-ab12cd") or kind/name ("replica/qwen-0-ab12cd")."""
    return obj in (event.name, event.object)


def recent_events(
    store: Store, limit: int = 100, *, kind: str | None = None, name: str | None = None,
    obj: str | None = None, since: float | None = None, tenant: str | None = None,
) -> list[EventRecord]:
    """The newest ``limit`` events matching the filters, oldest first (``since``: unix seconds,
    events strictly after it; ``tenant``: only that tenant's events, for a tenant-bound caller)."""
    events = [event for _, event in event_records.timed(store, since)]
    matching = [e for e in events
                if (kind is None or e.kind == kind) and (name is None or e.name == name)
                and (obj is None or matches_object(e, obj)) and (since is None or e.time > since)
                and (tenant is None or e.tenant == tenant)]
    return matching[-limit:] if limit > 0 else []


class EventSink:
    """record_event with the log's bounds bound in, for the controllers."""

    def __init__(self, store: Store, *, keep: int = 1000, max_age_s: float = DEFAULT_MAX_AGE_S):
        self.store, self.keep, self.max_age_s = store, keep, max_age_s

    def __call__(self, kind: str, name: str, reason: str, message: str, *, tenant: str | None = None,
                 warning: bool = False, now: float | None = None) -> EventRecord:
        return record_event(self.store, kind, name, reason, message, tenant=tenant, keep=self.keep,
                            max_age_s=self.max_age_s, now=now, type="Warning" if warning else "Normal")
