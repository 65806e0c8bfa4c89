"""The backup document: desired state as one versioned JSON document, and the restore plan.

A backup holds what operators wrote, never what controllers derive: models, profiles,
deployments (with their revisions and whatever scaling fields they carry), endpoints, sites,
API key records (HMAC digests only; the gateway's FABRIC_KEY_HMAC_SECRET must be the same where
they are restored for the keys to keep working), model aliases, identity mappings, tenant
limits, and quotas, policies and tenants when this fabricd stores them. `status` is dropped from every record: replicas, GPU reservations, VIPs,
observations and events are rebuilt by the controllers, and model bytes stay on the nodes.

    {"format": "fabric-backup", "version": 1, "created_at": ..., "sections": {
        "models": {"<name>": {...}}, "profiles": {...}, ..., "keys": {"<id>": {...}}, "model_aliases": {...}}}

Records are keyed by their store key below the section's prefix (a name, a key id, or
"deployment/00000003" for a revision). A restore is planned against the target store's records:
absent -> create, equal -> unchanged, different -> conflict (written only with replace).
Every record is validated with its schema and every reference (deployment -> model and profile,
endpoint -> deployment, revision -> deployment, model and profile, key -> endpoint) must resolve in the backup or the store before
anything is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from common import keyspace
from common.errors import InvalidInput
from common.identity_mappings import IdentityMapping
from common.model_aliases import ModelAlias
from common.rollouts import Revision
from common.schemas import (
    ApiKeyRecord,
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    ModelArtifact,
    Site,
)
from common.tenant_limits import TenantLimits

FORMAT = "fabric-backup"
VERSION = 1
MAX_RECORDS = 100_000


@dataclass(frozen=True)
class Section:
    name: str
    prefix: str
    schema: type[BaseModel] | None  # None: kept as JSON (a record kind this release does not model)


def _optional(name: str) -> list[Section]:
    """Quotas, policies and tenants, when this release's keyspace has them."""
    prefix_of: Callable[[], str] | None = getattr(keyspace, name, None)
    return [Section(name, prefix_of(), None)] if prefix_of else []


# Restore order: what others refer to comes first.
SECTIONS: tuple[Section, ...] = (
    Section("sites", keyspace.sites(), Site),
    *_optional("tenants"),
    *_optional("quotas"),
    *_optional("policies"),
    Section("models", keyspace.models(), ModelArtifact),
    Section("profiles", keyspace.profiles(), InferenceProfile),
    Section("deployments", keyspace.deployments(), InferenceDeployment),
    Section("revisions", keyspace.revisions(), Revision),
    Section("endpoints", keyspace.endpoints(), InferenceEndpoint),
    Section("keys", keyspace.api_keys(), ApiKeyRecord),
    Section("key_policies", keyspace.key_policies(), None),
    Section("model_aliases", keyspace.model_aliases(), ModelAlias),
    Section("identity_mappings", keyspace.identity_mappings(), IdentityMapping),
    Section("tenant_limits", keyspace.tenant_limits(), TenantLimits),
)
BY_NAME = {s.name: s for s in SECTIONS}


def desired(value: str) -> dict:
    """A stored record without its observed part."""
    record = json.loads(value)
    if isinstance(record, dict):
        record.pop("status", None)
    return record


def build(listed: Mapping[str, list[tuple[str, str]]], now: float | None = None) -> dict:
    """The document from each section's (key, value) pairs as listed from the store."""
    sections = {}
    for section in SECTIONS:
        pairs = listed.get(section.name, [])
        sections[section.name] = {key[len(section.prefix):]: desired(value) for key, value in sorted(pairs)}
    return {"format": FORMAT, "version": VERSION, "created_at": time.time() if now is None else now,
            "sections": sections}


@dataclass(frozen=True)
class Change:
    section: str
    name: str
    action: str  # create | unchanged | conflict
    differs: tuple[str, ...] = ()  # fields that differ, for a conflict


@dataclass
class RestorePlan:
    changes: list[Change] = field(default_factory=list)
    records: dict[tuple[str, str], dict] = field(default_factory=dict)  # (section, name) -> record to write

    @property
    def conflicts(self) -> list[Change]:
        return [c for c in self.changes if c.action == "conflict"]

    def summary(self) -> dict[str, int]:
        out = {"create": 0, "unchanged": 0, "conflict": 0}
        for c in self.changes:
            out[c.action] += 1
        return out


def _check_header(doc: object) -> dict:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InvalidInput(f"not a Fabric backup: expected \"format\": \"{FORMAT}\"")
    if doc.get("version") != VERSION:
        raise InvalidInput(f"backup version {doc.get('version')!r} is not supported; this fabricd reads version "
                           f"{VERSION}")
    sections = doc.get("sections")
    if not isinstance(sections, dict):
        raise InvalidInput("backup has no \"sections\" object")
    unknown = sorted(set(sections) - set(BY_NAME))
    if unknown:
        raise InvalidInput(f"backup has sections this fabricd does not store: {', '.join(unknown)}")
    total = sum(len(v) for v in sections.values() if isinstance(v, dict))
    if total > MAX_RECORDS:
        raise InvalidInput(f"backup has {total} records; at most {MAX_RECORDS}")
    return sections


def _validate(section: Section, name: str, record: object) -> dict:
    where = f"{section.name}/{name}"
    if not name or "\n" in name or name.startswith("/") or ".." in name.split("/"):
        raise InvalidInput(f"{where}: not a valid record name")
    if not isinstance(record, dict):
        raise InvalidInput(f"{where}: a record must be a JSON object")
    if section.schema is None:
        return record
    try:
        parsed = section.schema.model_validate(record)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ())) or "record"
        raise InvalidInput(f"{where}: {loc}: {first.get('msg', 'invalid')}") from None
    expected = _identity(section.name, parsed)
    if expected is not None and expected != name:
        raise InvalidInput(f"{where}: the record names itself {expected!r}")
    return parsed.model_dump(mode="json", exclude={"status"}) if "status" in type(parsed).model_fields \
        else parsed.model_dump(mode="json")


def _identity(section: str, parsed: BaseModel) -> str | None:
    if section == "keys":
        return parsed.id
    if section == "revisions":
        return keyspace.revisions(parsed.deployment, parsed.revision)[len(keyspace.revisions()):]
    return getattr(parsed, "name", None)


def _normalized(section: Section, record: dict | None) -> dict | None:
    """A stored record in the form a validated backup record has (defaults of fields added since
    it was written filled in), so only real differences count as conflicts."""
    if record is None or section.schema is None:
        return record
    try:
        parsed = section.schema.model_validate(record)
    except ValidationError:
        return record
    return parsed.model_dump(mode="json", exclude={"status"} if "status" in type(parsed).model_fields else None)


def _differs(old: dict, new: dict) -> tuple[str, ...]:
    keys = set(old) | set(new)
    return tuple(sorted(k for k in keys if k != "created_at" and old.get(k) != new.get(k)))


def plan_restore(doc: object, current: Mapping[str, Mapping[str, dict]]) -> RestorePlan:
    """What a restore of ``doc`` would do to a store whose desired records are ``current``
    (section -> name -> record without status). Raises InvalidInput on any bad record or
    dangling reference, before anything is written."""
    sections = _check_header(doc)
    plan = RestorePlan()
    for section in SECTIONS:
        records = sections.get(section.name, {})
        if not isinstance(records, dict):
            raise InvalidInput(f"section {section.name} must be an object of records")
        for name in sorted(records):
            record = _validate(section, name, records[name])
            existing = _normalized(section, current.get(section.name, {}).get(name))
            if existing is None:
                action, differs = "create", ()
            else:
                differs = _differs(existing, record)
                action = "conflict" if differs else "unchanged"
            plan.changes.append(Change(section.name, name, action, differs))
            plan.records[(section.name, name)] = record
    _check_references(plan, current)
    return plan


def _check_references(plan: RestorePlan, current: Mapping[str, Mapping[str, dict]]) -> None:
    def known(section: str, name: str) -> bool:
        return (section, name) in plan.records or name in current.get(section, {})

    for (section, name), record in plan.records.items():
        refs: list[tuple[str, str]] = []
        if section == "deployments":
            refs = [("models", record["model"]), ("profiles", record["profile"])]
        elif section == "endpoints":
            # An external endpoint's deployment is a name only (never read), as on create.
            refs = [] if record.get("external") else [("deployments", record["deployment"])]
            refs += [("deployments", d) for d in record.get("spillover") or []]
            refs += [("endpoints", e) for e in record.get("fallbacks") or []]
        elif section in ("keys", "model_aliases"):
            refs = [("endpoints", record["endpoint"])]
        elif section == "revisions":
            template = record["template"]
            refs = [("deployments", record["deployment"]), ("models", template["model"]),
                    ("profiles", template["profile"])]
        for ref_section, ref in refs:
            if not known(ref_section, ref):
                raise InvalidInput(f"{section}/{name} refers to {ref_section[:-1]} {ref!r}, which is neither in the "
                                   "backup nor in this store")
