"""Declarative apply's generic in-place change: the fields a document changed, merged into the
stored record by compare-and-swap (status untouched), with an "updated" event.

Kinds with their own checks (a deployment's replicas, autoscaling and capacity class; a quota)
go through their family's operation instead (controlplane.api.documents' KINDS names which).
"""

from __future__ import annotations

from pydantic import BaseModel

from common.errors import NotFound
from common.records.resource import Records
from controlplane.ops import common
from controlplane.state import AppState


def merge(ctx: AppState, records: Records, name: str, changes: dict, *, label: str, event_kind: str) -> BaseModel:
    """Write ``changes`` into record ``name``; ``label`` names the document kind in messages."""
    def change(record):
        return records.model.model_validate({**record.model_dump(mode="json"), **changes}, context={"stored": True})

    try:
        record = records.update(ctx.store, name, change,
                                busy=f"{label} {name!r} changed too often while applying; try again")
    except NotFound:
        raise NotFound(f"{label} {name!r} was deleted meanwhile") from None
    common.event(ctx, event_kind, name, "updated", f"{label} {name}: {', '.join(sorted(changes))} changed by apply",
                 tenant=getattr(record, "tenant", None))
    return record
