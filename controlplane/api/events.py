"""The event log (see controlplane.events) and a watch on it.

    GET /api/ai/events?limit=&kind=&name=      recent events, oldest first; an unknown kind is 422
    GET /api/ai/watch/{family}?revision=R&timeout=S
                                               long-poll the store watch under one resource family
                                               (events, deployments, endpoints, ...): returns
                                               {"revision", "changes": [{type, name, value}]} as soon
                                               as anything after revision R changes, or an empty
                                               list after S seconds (at most 60). revision 0 answers
                                               at once with the current revision, to start from.
`fabricctl ai get deployments -w` and `fabricctl ai events -w` follow changes with it: one
request open per watcher, no polling loop.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Query

from common import keyspace
from common.errors import InvalidInput
from controlplane.auth import require_admin
from controlplane.events import EventRecord, recent_events, unknown_kind
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["events"], dependencies=[Depends(require_admin)])

# family -> keyspace prefix function; the name of a change is its key below the prefix.
WATCHABLE = {"events": keyspace.events, "deployments": keyspace.deployments, "endpoints": keyspace.endpoints,
             "models": keyspace.models, "profiles": keyspace.profiles, "replicas": keyspace.replicas}
MAX_WATCH_S = 60.0


@router.get("/events", response_model=list[EventRecord])
def list_events(
    state: StateDep,
    limit: int = Query(100, ge=1, le=1000),
    kind: str | None = None,
    name: str | None = None,
) -> list[EventRecord]:
    if kind is not None:
        why = unknown_kind(state.store, kind)
        if why:
            raise InvalidInput(why, code="unknown_kind")
    return recent_events(state.store, limit, kind=kind, name=name)


@router.get("/watch/{family}")
def watch(family: str, state: StateDep, revision: int = Query(0, ge=0),
          timeout: float = Query(30.0, gt=0, le=MAX_WATCH_S)) -> dict:
    if family not in WATCHABLE:
        raise InvalidInput(f"family: cannot watch {family!r}; one of {', '.join(sorted(WATCHABLE))}")
    prefix = WATCHABLE[family]()
    if revision == 0:
        return {"revision": state.store.revision(), "changes": []}
    changes = state.store.watch(prefix, revision, timeout)
    out = []
    for ev in changes:
        try:
            value = json.loads(ev.value) if ev.value else None
        except ValueError:
            value = None
        out.append({"type": ev.type, "name": ev.key[len(prefix):], "revision": ev.revision, "value": value})
    last = max((ev.revision for ev in changes), default=revision)
    return {"revision": last, "changes": out}
