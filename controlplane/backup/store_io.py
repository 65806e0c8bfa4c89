"""The store side of backup and restore (the document is controlplane.backup.document): read every
section's records as stored, check a plan against the store, and write it. A backup copies whole
keyspaces as they are, so it reads and writes them as text through common.records.raw, the door's
one uninterpreted reader (create-if-absent for a create, so a record that appeared meanwhile is kept)."""

from __future__ import annotations

import json

from common import keyspace
from common.errors import Conflict
from common.records import raw
from common.store.base import Store
from controlplane.backup.document import BY_NAME, SECTIONS, RestorePlan, desired


def listed(store: Store) -> dict[str, list[tuple[str, str]]]:
    return {section.name: raw.items(store, section.prefix) for section in SECTIONS}


def current(store: Store) -> dict[str, dict[str, dict]]:
    return {name: {key[len(BY_NAME[name].prefix):]: desired(value) for key, value in pairs}
            for name, pairs in listed(store).items()}


def stored_form(section: str, record: dict) -> str:
    schema = BY_NAME[section].schema
    if schema is None:
        return json.dumps(record)
    # Validated again so observed fields take their defaults (status Pending, and so on).
    return schema.model_validate(record).model_dump_json()


def check_key_prefixes(store: Store, plan: RestorePlan) -> None:
    """A restored key must not take a prefix another key of this store holds (the gateway looks
    keys up by prefix)."""
    for (section, name), record in plan.records.items():
        if section != "keys":
            continue
        owner = raw.value(store, keyspace.api_key_prefixes(record["prefix"]))
        if owner is not None and owner != name:
            raise Conflict(f"key {name}: prefix {record['prefix']} already belongs to key {owner}",
                           code="conflict")


def write(store: Store, plan: RestorePlan) -> tuple[list[str], list[str]]:
    """Write every change that is not "unchanged": (written, raced: creates that found a record)."""
    written, raced = [], []
    for change in plan.changes:
        if change.action == "unchanged":
            continue
        section = BY_NAME[change.section]
        key = section.prefix + change.name
        value = stored_form(change.section, plan.records[(change.section, change.name)])
        if change.action == "create":
            if not raw.create(store, key, value):
                raced.append(f"{change.section}/{change.name}")
                continue
        else:
            raw.put(store, key, value)
        if change.section == "keys":
            rec = plan.records[(change.section, change.name)]
            raw.create(store, keyspace.api_key_prefixes(rec["prefix"]), change.name)
            raw.create(store, keyspace.api_key_names(rec["endpoint"], rec["name"]), change.name)
        written.append(f"{change.section}/{change.name}")
    return written, raced
