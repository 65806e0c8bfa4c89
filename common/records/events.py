"""The event log: what happened to which object and why, for people (`fabricctl ai events`).

Every create, delete and scale the API accepts is recorded here, and the controllers record
what they decide and what fails (placement, replica lifecycle, VIPs, weight changes, scaling,
quota refusals, agent errors) through the same ``record_event``. An event names its object by
``kind`` and ``name`` (``object`` is "kind/name"), says why in ``reason`` (the stored ``action``:
created, ReplicaReady, ProbeFailed, ScaledOut, QuotaRefused, ...), how bad in ``type`` (Normal
or Warning) and what in ``message``.

Events are stored one key each under keyspace.events(), keyed by nanosecond time plus a random
suffix, so a prefix listing is chronological and two fabricd processes never overwrite each
other. The log is bounded on every store: a trim drops the oldest events beyond ``keep``
(FABRIC_EVENTS_KEPT, 1000) and those older than ``max_age_s`` (FABRIC_EVENTS_MAX_AGE_SECS,
7 days). A trim lists the whole log, so ``record_event`` (an API call's event, a gateway's note)
trims after its write, and a loop's ``EventSink`` (a pass may write one event per endpoint whose
weights moved) after every ``keep // 20`` of its writes or a minute after its last trim: the log
holds at most that many events beyond ``keep`` per loop. Controllers rate-limit themselves (one
event per change, never per tick).

This module is the one event writer of every process (fabricd's API, ops and loops, and the
gateway's KV-blind notes): ``record_event`` (or an ``EventSink`` with the bounds bound in) builds
the record, validates it through ``EventRecord`` and writes it under its own key.
"""

from __future__ import annotations

import secrets
import time
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from common import keyspace
from common.records import reading
from common.store.base import Store


class EventRecord(BaseModel):
    time: float = Field(..., description="unix seconds")
    kind: str = Field(..., description="object kind: model, profile, deployment, endpoint, replica, node, ...")
    name: str = Field(..., description="object name (a replica's id is also its VM's name)")
    action: str = Field(..., description="why: created, deleted, scaled, ReplicaReady, ProbeFailed, ScaledOut, ...")
    message: str = ""
    type: Literal["Normal", "Warning"] = "Normal"
    tenant: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def object(self) -> str:
        return f"{self.kind}/{self.name}"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def reason(self) -> str:
        return self.action


def event_key(now: float) -> str:
    return keyspace.events(f"{int(now * 1e9):020d}-{secrets.token_hex(4)}")


def key_time(key: str) -> float:
    stamp = key.rsplit("/", 1)[-1].partition("-")[0]
    return int(stamp) / 1e9 if stamp.isdigit() else 0.0


def new_event(kind: str, name: str, action: str, message: str, *, tenant: str | None = None,
              warning: bool = False, now: float | None = None) -> EventRecord:
    """An event record, not yet written (``EventSink.write_all`` writes a pass's in one batch)."""
    return EventRecord(time=time.time() if now is None else now, kind=kind, name=name, action=action,
                       message=message, tenant=tenant, type="Warning" if warning else "Normal")


def _append(store: Store, *records: EventRecord) -> list[EventRecord]:
    """Write events, each under a fresh key (stored without its computed ``object``/``reason``);
    several in one batch."""
    stored = [EventRecord.model_validate(e.model_dump(exclude={"object", "reason"}), context={"stored": True})
              for e in records]
    items = [(event_key(e.time), e.model_dump_json(exclude={"object", "reason"})) for e in stored]
    if len(items) == 1:
        store.put(*items[0])
    elif items:
        store.put_all(items)
    return stored


def timed(store: Store, since: float | None = None) -> list[tuple[float, EventRecord]]:
    """(key time, event) of every readable event, oldest first; ``since``: keyed after it (less
    a microsecond, the key's rounding). Values that do not parse as events are skipped."""
    out = []
    for kv in store.list(keyspace.events()):
        at = key_time(kv.key)
        if since is not None and at <= since - 1e-6:
            continue
        out += [(at, event) for event in reading.each(EventRecord, [kv], "event")]
    return out


def kinds(store: Store) -> set[str]:
    return {event.kind for _, event in timed(store)}


def _trim_before(store: Store, keep: int, older_than: float) -> int:
    """Delete events beyond the newest ``keep`` and those keyed before ``older_than``; how many."""
    prefix = keyspace.events()
    kvs = store.list(prefix)
    # Keys sort by time (event_key), so the doomed ones are the oldest: one range delete up to
    # the last of them (an event written meanwhile sorts after it and stays).
    doomed = max(len(kvs) - keep, 0)
    while doomed < len(kvs) and key_time(kvs[doomed].key) < older_than:
        doomed += 1
    if not doomed:
        return 0
    return store.delete_prefix(prefix, below=kvs[doomed - 1].key + "\0")


DEFAULT_MAX_AGE_S = 7 * 86400.0

# Kinds the event log knows without having seen them; a filter on any other kind that no stored
# event carries is refused (`--kind bogus` is a typo, not an empty answer). Modules that record
# events of a new kind add it here.
KNOWN_KINDS = frozenset({"model", "profile", "deployment", "endpoint", "node", "key", "replica", "site",
                         "policy", "quota", "autoscaler", "rollout", "tenant", "job", "backup"})


def unknown_kind(store: Store, kind: str) -> str | None:
    """Why `kind` is not a kind to filter on, or None when it is one."""
    known = KNOWN_KINDS | kinds(store)
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
    event = _append(store, new_event(kind, name, action, message, tenant=tenant, warning=type == "Warning",
                                     now=now))[0]
    trim(store, keep, max_age_s, now=event.time)
    return event


def trim(store: Store, keep: int, max_age_s: float = DEFAULT_MAX_AGE_S, *, now: float | None = None) -> int:
    """Delete events beyond the newest ``keep`` and those older than ``max_age_s``; how many."""
    now = time.time() if now is None else now
    return _trim_before(store, keep, now - max_age_s)


def matches_object(event: EventRecord, obj: str) -> bool:
    """``obj`` is a name ("qwen-0-ab12cd") or kind/name ("replica/qwen-0-ab12cd")."""
    return obj in (event.name, event.object)


def recent_events(
    store: Store, limit: int = 100, *, kind: str | None = None, name: str | None = None,
    obj: str | None = None, since: float | None = None, tenant: str | None = None,
) -> list[EventRecord]:
    """The newest ``limit`` events matching the filters, oldest first (``since``: unix seconds,
    events strictly after it; ``tenant``: only that tenant's events, for a tenant-bound caller)."""
    events = [event for _, event in timed(store, since)]
    matching = [e for e in events
                if (kind is None or e.kind == kind) and (name is None or e.name == name)
                and (obj is None or matches_object(e, obj)) and (since is None or e.time > since)
                and (tenant is None or e.tenant == tenant)]
    return matching[-limit:] if limit > 0 else []


SINK_TRIM_SECS = 60.0  # a sink trims at least this often while it writes


class EventSink:
    """record_event with the log's bounds bound in, for the controllers' loops: it trims after
    every ``keep // 20`` of its writes (at least 1) or SINK_TRIM_SECS after its last trim, not
    after each write (the module docstring)."""

    def __init__(self, store: Store, *, keep: int = 1000, max_age_s: float = DEFAULT_MAX_AGE_S):
        self.store, self.keep, self.max_age_s = store, keep, max_age_s
        self.trim_every = max(1, keep // 20)
        self._untrimmed = 0  # writes since the last trim
        self._trimmed_at = -float("inf")

    def __call__(self, kind: str, name: str, reason: str, message: str, *, tenant: str | None = None,
                 warning: bool = False, now: float | None = None) -> EventRecord:
        return self.write_all([new_event(kind, name, reason, message, tenant=tenant, warning=warning, now=now)])[0]

    def write_all(self, records: list[EventRecord]) -> list[EventRecord]:
        """Write events in one batch, then trim if due (the class docstring)."""
        stored = _append(self.store, *records)
        if stored:
            self._untrimmed += len(stored)
            latest = max(e.time for e in stored)
            if self._untrimmed >= self.trim_every or latest - self._trimmed_at >= SINK_TRIM_SECS:
                trim(self.store, self.keep, self.max_age_s, now=latest)
                self._untrimmed, self._trimmed_at = 0, latest
        return stored
