"""Declarative documents: the kinds `fabricctl ai apply|get|delete` know, and the pure functions
between a document and a stored record.

A document has the kubectl shape; `status` is shown by get and ignored by apply:

    apiVersion: fabric/v1
    kind: InferenceDeployment
    metadata: {name: demo-llm, tenant: acme}      # tenant only when set
    spec: {model: demo-llm, profile: lab-h100, replicas: 3}

Adding a kind is one entry in KINDS (TenantQuota joined that way; a deployment's autoscaling is a
field of InferenceDeployment): its schema, where its records live, whether fabricctl can delete
it, the operation that creates one and the one that changes it in place (controlplane.ops, the
functions the REST routes call), which spec fields may change in place, and the fields the
server owns. Entries are in dependency order: apply creates in this order, delete -f removes in
reverse.

Apply is create-or-update with patch semantics: only the fields a document sets are compared
with the stored record, so `get -o yaml | apply -f -` is "unchanged". A change to a field that
cannot change in place is refused naming the field and what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import BaseModel

from common import keyspace
from common.schemas import (
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    ModelArtifact,
    TenantQuota,
)
from controlplane.ops import deployments as deployment_ops
from controlplane.ops import endpoints as endpoint_ops
from controlplane.ops import models as model_ops
from controlplane.ops import profiles as profile_ops
from controlplane.ops import quotas as quota_ops

API_VERSION = "fabric/v1"
METADATA_FIELDS = ("name", "tenant")


@dataclass(frozen=True)
class Kind:
    name: str  # the document's `kind`
    plural: str  # the REST collection, /api/ai/{plural}; also the watch family
    schema: type[BaseModel]
    key: Callable[[str], str]  # keyspace path of one record
    create: Callable  # the operation that creates one: op(ctx, caller, body) (controlplane.ops)
    mutable: frozenset[str] = frozenset()  # spec fields apply may change in place
    update: Callable | None = None  # op(ctx, caller, name, changes); None: ops.apply.merge
    server_fields: frozenset[str] = frozenset({"status", "created_at"})  # never in a document's spec
    aliases: tuple[str, ...] = ()
    immutable_hint: dict[str, str] = field(default_factory=dict)  # field -> what to do instead
    name_field: str = "name"  # the record field metadata.name maps to
    deletable: bool = True  # DELETE /api/ai/{plural}/{name} exists
    has_tenant: bool = True  # metadata.tenant maps to the record's tenant


KINDS: tuple[Kind, ...] = (
    Kind("ModelArtifact", "models", ModelArtifact, keyspace.models, model_ops.create,
         mutable=frozenset({"license", "residency"}), aliases=("model", "models", "mo")),
    Kind("InferenceProfile", "profiles", InferenceProfile, keyspace.profiles,
         profile_ops.create, aliases=("profile", "profiles", "pr"),
         server_fields=frozenset({"created_at"}),
         immutable_hint={"*": "a profile is fixed once made: add a new profile and roll the deployment to it"}),
    Kind("InferenceDeployment", "deployments", InferenceDeployment, keyspace.deployments,
         deployment_ops.create,
         mutable=frozenset({"replicas", "autoscaling", "capacity_class"}),
         update=deployment_ops.update, server_fields=frozenset({"status", "created_at", "revision"}),
         aliases=("deployment", "deployments", "deploy", "dep"),
         immutable_hint={"model": "write a revision and roll it out (fabricctl ai deployment revise ...)",
                         "profile": "write a revision and roll it out (fabricctl ai deployment revise ...)",
                         "engine_args": "write a revision and roll it out (fabricctl ai deployment revise ...)"}),
    Kind("InferenceEndpoint", "endpoints", InferenceEndpoint, keyspace.endpoints,
         endpoint_ops.create,
         mutable=frozenset({"routing", "preferred_site", "allowed_sites", "residency"}),
         aliases=("endpoint", "endpoints", "ep")),
    Kind("TenantQuota", "quotas", TenantQuota, keyspace.quotas, quota_ops.set_quota,
         mutable=frozenset({"max_gpus", "max_cpu", "max_memory_gib", "guaranteed_gpus"}), update=quota_ops.update,
         server_fields=frozenset({"updated_at"}), aliases=("quota", "quotas"), name_field="tenant",
         deletable=False, has_tenant=False),
)


class DocumentError(ValueError):
    """A document that cannot be applied; the message names the document and the field."""


def find_kind(name: str) -> Kind:
    lowered = name.lower()
    for kind in KINDS:
        if lowered in (kind.name.lower(), kind.plural, *kind.aliases):
            return kind
    known = ", ".join(k.name for k in KINDS)
    raise DocumentError(f"kind: unknown kind {name!r}; one of {known} (or their plural/short names)")


def to_document(kind: Kind, record: dict) -> dict:
    """The stored record as a document: metadata, spec without server fields, status as is."""
    metadata = {"name": record.get(kind.name_field)}
    if kind.has_tenant and record.get("tenant") is not None:
        metadata["tenant"] = record["tenant"]
    owned = {kind.name_field, *(("tenant",) if kind.has_tenant else ()), *kind.server_fields}
    spec = {k: v for k, v in record.items() if k not in owned}
    doc = {"apiVersion": API_VERSION, "kind": kind.name, "metadata": metadata, "spec": spec}
    if "status" in record and "status" in kind.server_fields:
        doc["status"] = record["status"]
    return doc


@dataclass(frozen=True)
class Parsed:
    kind: Kind
    name: str
    body: dict  # what the kind's create operation takes (metadata + spec, validated)
    given: dict  # the spec fields the document set, validated and normalised


def parse_document(doc: object, where: str) -> Parsed:
    """Validate one document; `where` names it in errors ("document 2 (deployments.yaml)")."""
    if not isinstance(doc, dict):
        raise DocumentError(f"{where}: expected a mapping with kind, metadata and spec")
    if doc.get("apiVersion", API_VERSION) != API_VERSION:
        raise DocumentError(f"{where}: apiVersion {doc.get('apiVersion')!r} is not {API_VERSION}")
    try:
        kind = find_kind(str(doc.get("kind", "")))
    except DocumentError as exc:
        raise DocumentError(f"{where}: {exc}") from None
    metadata, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise DocumentError(f"{where}: metadata and spec must be mappings")
    if not metadata.get("name"):
        raise DocumentError(f"{where}: metadata.name is required")
    allowed = METADATA_FIELDS if kind.has_tenant else ("name",)
    extra = set(metadata) - set(allowed)
    if extra:
        raise DocumentError(f"{where}: metadata.{min(extra)} is not a field (metadata has {', '.join(allowed)})")
    owned = set(spec) & kind.server_fields
    if owned:
        raise DocumentError(f"{where}: spec.{min(owned)} is set by the server, not by a document")
    body = {**spec, kind.name_field: metadata["name"]}
    if kind.has_tenant and metadata.get("tenant") is not None:
        body["tenant"] = metadata["tenant"]
    try:
        model = kind.schema.model_validate(body)
    except ValueError as exc:
        errors = getattr(exc, "errors", list)()
        first = errors[0] if errors else {"loc": (), "msg": str(exc)}
        loc = ".".join(str(p) for p in first.get("loc", ()))
        section = "metadata" if loc.split(".")[0] in (*METADATA_FIELDS, kind.name_field) else "spec"
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise DocumentError(f"{where} ({kind.name} {metadata['name']}): {section}.{loc}: {msg}") from None
    normalised = model.model_dump(mode="json")
    given = {k: normalised[k] for k in spec if k in normalised}
    if kind.has_tenant and "tenant" in metadata:
        given["tenant"] = normalised.get("tenant")
    return Parsed(kind, str(metadata["name"]), {k: v for k, v in body.items()}, given)


def spec_diff(given: dict, stored: dict) -> list[dict]:
    """[{field, from, to}] for each field the document sets that differs from the stored record."""
    return [{"field": k, "from": stored.get(k), "to": v} for k, v in sorted(given.items()) if stored.get(k) != v]


def refusal(kind: Kind, name: str, diff: list[dict]) -> str | None:
    """Why these changes cannot be made in place, or None when they can."""
    fixed = [d["field"] for d in diff if d["field"] not in kind.mutable]
    if not fixed:
        return None
    hint = kind.immutable_hint.get(fixed[0]) or kind.immutable_hint.get("*") or \
        f"delete and re-create the {kind.name} to change it"
    return f"{kind.name} {name}: spec.{fixed[0]} cannot change in place ({hint})"


def order_key(parsed: Parsed) -> int:
    return KINDS.index(parsed.kind)
