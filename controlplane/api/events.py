"""GET /api/ai/events: the recent event log (see controlplane.events)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from controlplane.auth import require_admin
from controlplane.events import EventRecord, recent_events
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["events"], dependencies=[Depends(require_admin)])


@router.get("/events", response_model=list[EventRecord])
def list_events(
    state: StateDep,
    limit: int = Query(100, ge=1, le=1000),
    kind: str | None = None,
    name: str | None = None,
) -> list[EventRecord]:
    return recent_events(state.store, limit, kind=kind, name=name)
