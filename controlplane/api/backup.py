"""Backup and restore of desired state (controlplane/backup/document.py). Admin token.

    POST /api/ai/backup                           -> the backup document (JSON)
    POST /api/ai/restore[?apply=true][&replace=true]   body: a backup document

A restore is a dry run unless ``apply=true``: the answer lists each record as create,
unchanged or conflict (with the fields that differ). Applying with any conflict is 409 and
writes nothing, unless ``replace=true`` (then conflicting records are overwritten). Records are
validated and references checked before the first write; creates use create-if-absent, so a
record that appeared meanwhile is reported, never overwritten without replace.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query
from pydantic import BaseModel, Field

from common.errors import Conflict
from common.schemas import InferenceEndpoint
from controlplane.api.resources import refuse_outbound_reach
from controlplane.auth import PrincipalDep, require_admin
from controlplane.backup import store_io
from controlplane.backup.document import RestorePlan, build, plan_restore
from controlplane.events import record_event
from controlplane.state import StateDep
from controlplane.tenancy.principal import Principal

router = APIRouter(prefix="/api/ai", tags=["backup"], dependencies=[Depends(require_admin)])


class BackupDocument(BaseModel):
    format: str = Field(..., description="fabric-backup")
    version: int
    created_at: float
    sections: dict[str, dict[str, Any]] = Field(..., description="section -> record name -> the record as "
                                                "stored, without its status")


class RestoreChange(BaseModel):
    section: str
    name: str
    action: str = Field(..., description="create | unchanged | conflict")
    differs: list[str] = Field(..., description="the fields that differ, for a conflict")


class RestoreAnswer(BaseModel):
    dry_run: bool
    summary: dict[str, int] = Field(..., description="records per action")
    changes: list[RestoreChange]
    written: list[str] | None = Field(None, description="applied: the records written")
    kept_meanwhile: list[str] | None = Field(None, description="applied: records that appeared meanwhile "
                                             "and were kept")


def _plan_body(plan: RestorePlan, *, applied: bool, written: list[str] | None = None) -> dict:
    return {
        "dry_run": not applied,
        "summary": plan.summary(),
        "changes": [{"section": c.section, "name": c.name, "action": c.action, "differs": list(c.differs)}
                    for c in plan.changes],
        **({"written": written} if written is not None else {}),
    }


@router.post("/backup", response_model=BackupDocument)
def backup(state: StateDep) -> dict:
    return build(store_io.listed(state.store))


def _check_outbound_reach(who: Principal, plan: RestorePlan) -> None:
    """Endpoints with an external provider or fallbacks are an admin's to write, here as through
    POST /api/ai/endpoints (controlplane.api.resources.refuse_outbound_reach)."""
    for (section, _name), record in plan.records.items():
        if section == "endpoints":
            refuse_outbound_reach(who, InferenceEndpoint.model_validate(record))


@router.post("/restore", response_model=RestoreAnswer, response_model_exclude_unset=True)
def restore(state: StateDep, who: PrincipalDep, doc: Any = Body(...), apply: bool = Query(False),
            replace: bool = Query(False)) -> dict:
    store = state.store
    plan = plan_restore(doc, store_io.current(store))
    _check_outbound_reach(who, plan)
    if not apply:
        return _plan_body(plan, applied=False)
    if plan.conflicts and not replace:
        names = ", ".join(f"{c.section}/{c.name}" for c in plan.conflicts[:20])
        raise Conflict(f"{len(plan.conflicts)} record(s) differ from this store ({names}); nothing was written. "
                       "Pass replace=true to overwrite them", code="conflict")
    store_io.check_key_prefixes(store, plan)
    written, raced = store_io.write(store, plan)
    record_event(store, "backup", "restore", "restored",
                 f"restore wrote {len(written)} record(s)" + (f"; {len(raced)} appeared meanwhile and were kept: "
                                                               f"{', '.join(raced[:10])}" if raced else ""),
                 keep=state.settings.events_kept)
    body = _plan_body(plan, applied=True, written=written)
    body["kept_meanwhile"] = raced
    return body
