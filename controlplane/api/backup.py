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

import json
from typing import Any

from fastapi import APIRouter, Body, Depends, Query

from common import keyspace
from common.errors import Conflict
from common.schemas import InferenceEndpoint
from common.store.base import Store
from controlplane.api.resources import refuse_outbound_reach
from controlplane.auth import PrincipalDep, require_admin
from controlplane.backup.document import BY_NAME, SECTIONS, RestorePlan, build, desired, plan_restore
from controlplane.events import record_event
from controlplane.state import StateDep
from controlplane.tenancy.principal import Principal

router = APIRouter(prefix="/api/ai", tags=["backup"], dependencies=[Depends(require_admin)])


def _listed(store: Store) -> dict[str, list[tuple[str, str]]]:
    return {section.name: [(kv.key, kv.value) for kv in store.list(section.prefix)] for section in SECTIONS}


def _current(store: Store) -> dict[str, dict[str, dict]]:
    return {name: {key[len(BY_NAME[name].prefix):]: desired(value) for key, value in pairs}
            for name, pairs in _listed(store).items()}


def _plan_body(plan: RestorePlan, *, applied: bool, written: list[str] | None = None) -> dict:
    return {
        "dry_run": not applied,
        "summary": plan.summary(),
        "changes": [{"section": c.section, "name": c.name, "action": c.action, "differs": list(c.differs)}
                    for c in plan.changes],
        **({"written": written} if written is not None else {}),
    }


def _stored_form(section: str, record: dict) -> str:
    schema = BY_NAME[section].schema
    if schema is None:
        return json.dumps(record)
    # Validated again so observed fields take their defaults (status Pending, and so on).
    return schema.model_validate(record).model_dump_json()


def _check_key_prefixes(store: Store, plan: RestorePlan) -> None:
    """A restored key must not take a prefix another key of this store holds (the gateway looks
    keys up by prefix)."""
    for (section, name), record in plan.records.items():
        if section != "keys":
            continue
        owner = store.get(keyspace.api_key_prefixes(record["prefix"]))
        if owner is not None and owner.value != name:
            raise Conflict(f"key {name}: prefix {record['prefix']} already belongs to key {owner.value}",
                           code="conflict")


@router.post("/backup")
def backup(state: StateDep) -> dict:
    return build(_listed(state.store))


def _check_outbound_reach(who: Principal, plan: RestorePlan) -> None:
    """Endpoints with an external provider or fallbacks are an admin's to write, here as through
    POST /api/ai/endpoints (controlplane.api.resources.refuse_outbound_reach)."""
    for (section, _name), record in plan.records.items():
        if section == "endpoints":
            refuse_outbound_reach(who, InferenceEndpoint.model_validate(record))


@router.post("/restore")
def restore(state: StateDep, who: PrincipalDep, doc: Any = Body(...), apply: bool = Query(False),
            replace: bool = Query(False)) -> dict:
    store = state.store
    plan = plan_restore(doc, _current(store))
    _check_outbound_reach(who, plan)
    if not apply:
        return _plan_body(plan, applied=False)
    if plan.conflicts and not replace:
        names = ", ".join(f"{c.section}/{c.name}" for c in plan.conflicts[:20])
        raise Conflict(f"{len(plan.conflicts)} record(s) differ from this store ({names}); nothing was written. "
                       "Pass replace=true to overwrite them", code="conflict")
    _check_key_prefixes(store, plan)
    written, raced = [], []
    for change in plan.changes:
        if change.action == "unchanged":
            continue
        section = BY_NAME[change.section]
        key = section.prefix + change.name
        value = _stored_form(change.section, plan.records[(change.section, change.name)])
        if change.action == "create":
            if not store.create(key, value):
                raced.append(f"{change.section}/{change.name}")
                continue
        else:
            store.put(key, value)
        if change.section == "keys":
            rec = plan.records[(change.section, change.name)]
            store.create(keyspace.api_key_prefixes(rec["prefix"]), change.name)
            store.create(keyspace.api_key_names(rec["endpoint"], rec["name"]), change.name)
        written.append(f"{change.section}/{change.name}")
    record_event(store, "backup", "restore", "restored",
                 f"restore wrote {len(written)} record(s)" + (f"; {len(raced)} appeared meanwhile and were kept: "
                                                               f"{', '.join(raced[:10])}" if raced else ""),
                 keep=state.settings.events_kept)
    body = _plan_body(plan, applied=True, written=written)
    body["kept_meanwhile"] = raced
    return body
