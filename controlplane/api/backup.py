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

from controlplane.auth import PrincipalDep, require_admin
from controlplane.backup import store_io
from controlplane.backup.document import RestorePlan, build, plan_restore
from controlplane.ops import backup as backup_ops
from controlplane.state import StateDep

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


@router.post("/restore", response_model=RestoreAnswer, response_model_exclude_unset=True)
def restore(state: StateDep, who: PrincipalDep, doc: Any = Body(...), apply: bool = Query(False),
            replace: bool = Query(False)) -> dict:
    plan = plan_restore(doc, store_io.current(state.store))
    if not apply:
        backup_ops.check(who, plan)
        return _plan_body(plan, applied=False)
    written, raced = backup_ops.restore(state, who, plan, replace=replace)
    body = _plan_body(plan, applied=True, written=written)
    body["kept_meanwhile"] = raced
    return body
