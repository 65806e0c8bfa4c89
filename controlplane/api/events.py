"""The event log (see common.records.events), a watch on it, and what it explains.

    GET /api/ai/events?object=&kind=&name=&since=&limit=
                                               newest matching events, oldest first; object is NAME or
                                               KIND/NAME; since is unix seconds or an age like 90s, 10m,
                                               2h; an unknown kind is 422
    GET /api/ai/watch/{family}?revision=R&timeout=S
                                               long-poll the store watch under one resource family
                                               (events, deployments, endpoints, ...): returns
                                               {"revision", "changes": [{type, name, value}]} as soon
                                               as anything after revision R changes, or an empty
                                               list after S seconds (at most 60). revision 0 answers
                                               at once with the current revision, to start from.
    GET /api/ai/explain/failure/{replica}      one replica's (or VM's) recorded history: every failed
                                               probe, start timeout, agent error and lifecycle step,
                                               with times, and its current record while it exists
`fabricctl ai get deployments -w` and `fabricctl ai events -w` follow changes with it: one
request open per watcher, no polling loop. Watches wait on threads of their own, at most 4 open
per caller and 32 in all (controlplane.watch_gate; one more is 429 with Retry-After).
"""

from __future__ import annotations

import json
import math
import re
import time

from fastapi import APIRouter, Depends, Query

from common import keyspace
from common.errors import InvalidInput, NotFound
from common.records import replicas
from common.records.events import EventRecord, recent_events, unknown_kind
from controlplane.api.answers import FailureExplained, WatchAnswer
from controlplane.auth import PrincipalDep, require_admin
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["events"], dependencies=[Depends(require_admin)])
AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str | None, now: float) -> float | None:
    """Unix seconds ("1764500000.5") or an age ("90s", "10m", "2h", "1d") -> unix seconds."""
    if value is None or value == "":
        return None
    m = AGE.match(value.strip())
    if m:
        return now - float(m.group(1)) * UNIT_S[m.group(2)]
    try:
        since = float(value)
    except ValueError:
        raise InvalidInput(f"since {value!r}: expected unix seconds or an age such as 90s, 10m, 2h, 1d",
                           code="invalid_since") from None
    if not math.isfinite(since) or since < 0:
        raise InvalidInput(f"since {value!r}: expected a non-negative number", code="invalid_since")
    return since

# family -> keyspace prefix function; the name of a change is its key below the prefix.
WATCHABLE = {"events": keyspace.events, "deployments": keyspace.deployments, "endpoints": keyspace.endpoints,
             "models": keyspace.models, "profiles": keyspace.profiles, "replicas": keyspace.replicas}
MAX_WATCH_S = 60.0


@router.get("/events", response_model=list[EventRecord])
def list_events(
    state: StateDep,
    who: PrincipalDep,
    limit: int = Query(100, ge=1, le=1000),
    kind: str | None = None,
    name: str | None = None,
    object: str | None = Query(None, max_length=200, description="NAME or KIND/NAME"),
    since: str | None = Query(None, max_length=40),
) -> list[EventRecord]:
    if kind is not None:
        why = unknown_kind(state.store, kind)
        if why:
            raise InvalidInput(why, code="unknown_kind")
    return recent_events(state.store, limit, kind=kind, name=name, obj=object,
                         since=parse_since(since, time.time()), tenant=who.tenant_filter)


@router.get("/watch/{family}", response_model=WatchAnswer,
            responses={429: {"description": "the caller's or fabricd's watches are at their cap "
                                            "(controlplane.watch_gate)"}})
async def watch(family: str, state: StateDep, who: PrincipalDep, revision: int = Query(0, ge=0),
                timeout: float = Query(30.0, gt=0, le=MAX_WATCH_S)) -> dict:
    if family not in WATCHABLE:
        raise InvalidInput(f"family: cannot watch {family!r}; one of {', '.join(sorted(WATCHABLE))}")
    prefix = WATCHABLE[family]()
    if revision == 0:
        return {"revision": await state.watches.run(who.subject, state.store.revision), "changes": []}
    # On the watch gate's own threads, capped: never the pool that serves /healthz and heartbeats.
    changes = await state.watches.run(who.subject, lambda: state.store.watch(prefix, revision, timeout))
    out = []
    for ev in changes:
        try:
            value = json.loads(ev.value) if ev.value else None
        except ValueError:
            value = None
        out.append({"type": ev.type, "name": ev.key[len(prefix):], "revision": ev.revision, "value": value})
    last = max((ev.revision for ev in changes), default=revision)
    return {"revision": last, "changes": out}


@router.get("/explain/failure/{replica}", response_model=FailureExplained)
def explain_failure(replica: str, state: StateDep) -> dict:
    history = [e for e in recent_events(state.store, 1000, name=replica) if e.kind in ("replica", "vm")]
    current = next((r for r in replicas.list(state.store) if r.replica_id == replica), None)
    if current is None and not history:
        raise NotFound(f"no replica or VM {replica!r} and no recorded events for it")
    failures = [e for e in history if e.type == "Warning"]
    return {
        "replica": replica,
        "current": current.model_dump(mode="json") if current else None,
        "failures": len(failures),
        "summary": failures[-1].message if failures else "no failure recorded",
        "history": [e.model_dump(mode="json") for e in history],
    }
