"""Event records: one key each under keyspace.events(), nanosecond time plus a random suffix, so a
prefix listing is chronological and two writers never overwrite each other (controlplane.events
is the log's API: filters, bounds, the sink). Every write is validated through ``EventRecord``."""

from __future__ import annotations

import secrets
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, computed_field

from common import keyspace
from common.records import cas
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


def append(store: Store, event: EventRecord) -> EventRecord:
    """Write one event under a fresh key (stored without its computed ``object``/``reason``)."""
    event = EventRecord.model_validate(event.model_dump(exclude={"object", "reason"}), context={"stored": True})
    store.put(event_key(event.time), event.model_dump_json(exclude={"object", "reason"}))
    return event


def timed(store: Store, since: float | None = None) -> list[tuple[float, EventRecord]]:
    """(key time, event) of every readable event, oldest first; ``since``: keyed after it (less
    a microsecond, the key's rounding). Values that do not parse as events are skipped."""
    out = []
    for kv in store.list(keyspace.events()):
        at = key_time(kv.key)
        if since is not None and at <= since - 1e-6:
            continue
        try:
            out.append((at, cas.parse(EventRecord, kv.value)))
        except ValidationError:
            continue
    return out


def kinds(store: Store) -> set[str]:
    return {event.kind for _, event in timed(store)}


def trim(store: Store, keep: int, older_than: float) -> int:
    """Delete events beyond the newest ``keep`` and those keyed before ``older_than``; how many."""
    kvs = store.list(keyspace.events())
    surplus = max(0, len(kvs) - keep)
    doomed = [kv for i, kv in enumerate(kvs) if i < surplus or key_time(kv.key) < older_than]
    for kv in doomed:
        store.delete(kv.key)
    return len(doomed)
