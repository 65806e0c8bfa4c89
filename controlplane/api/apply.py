"""Declarative apply over the REST API (documents and kinds: controlplane.api.documents).

    GET  /api/ai/kinds                          the kinds apply knows: name, plural, aliases
    GET  /api/ai/documents/{kind}               every record of a kind as a document
    GET  /api/ai/documents/{kind}/{name}        one
    POST /api/ai/apply  {"documents": [...], "sources": ["file#1", ...], "dry_run": false}
         -> {"dry_run", "results": [{kind, name, action, diff: [{field, from, to}]}]}
         action: created | updated | unchanged (with dry_run: the same words, nothing written)

Every document is validated, and every change checked against what may change in place, before
the first write: a bad document (422) or a forbidden change (409 "immutable") writes nothing.
Then documents are applied in dependency order (models, profiles, deployments, endpoints) through
the operations the REST routes call (controlplane.ops, named in each kind's entry), so events,
revisions and checks (quota under the admission lock, policy, outbound reach) are the same;
a write refused then (a missing reference) stops there, with the earlier ones applied.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from common.errors import Conflict, InvalidInput, NotFound
from common.records import Store
from common.records.resource import Records
from controlplane.api import documents as docs
from controlplane.api.answers import Applied, Document, KindInfo
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops.apply import merge
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["apply"])
AdminDep = Annotated[str, Depends(require_admin)]
MAX_DOCUMENTS = 500


class ApplyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    documents: list[dict] = Field(..., max_length=MAX_DOCUMENTS)
    sources: list[str] | None = None
    dry_run: bool = False


def _kind(name: str) -> docs.Kind:
    try:
        return docs.find_kind(name)
    except docs.DocumentError as exc:
        raise InvalidInput(str(exc), code="unknown_kind") from None


def _records(kind: docs.Kind) -> Records:
    return Records(kind.schema, kind.key, kind.name)


def _stored(store: Store, kind: docs.Kind, name: str) -> dict | None:
    return _records(kind).stored(store, name)


@router.get("/kinds", response_model=list[KindInfo])
def kinds(_: AdminDep) -> list[dict]:
    return [{"kind": k.name, "plural": k.plural, "aliases": list(k.aliases), "deletable": k.deletable}
            for k in docs.KINDS]


@router.get("/documents/{kind}", response_model=list[Document], response_model_exclude_unset=True)
def list_documents(kind: str, state: StateDep, _: AdminDep) -> list[dict]:
    k = _kind(kind)
    return [docs.to_document(k, record) for _, record in _records(k).stored_items(state.store)]


@router.get("/documents/{kind}/{name}", response_model=Document, response_model_exclude_unset=True)
def get_document(kind: str, name: str, state: StateDep, _: AdminDep) -> dict:
    k = _kind(kind)
    record = _stored(state.store, k, name)
    if record is None:
        raise NotFound(f"{k.name} {name!r} not found")
    return docs.to_document(k, record)


@router.post("/apply", response_model=Applied)
def apply(body: ApplyRequest, state: StateDep, who: PrincipalDep) -> dict:
    sources = body.sources or []
    parsed: list[docs.Parsed] = []
    for i, doc in enumerate(body.documents):
        where = sources[i] if i < len(sources) else f"document {i + 1}"
        try:
            parsed.append(docs.parse_document(doc, where))
        except docs.DocumentError as exc:
            raise InvalidInput(str(exc), code="invalid_document") from None
    seen: set[tuple[str, str]] = set()
    for p in parsed:
        if (p.kind.name, p.name) in seen:
            raise InvalidInput(f"{p.kind.name} {p.name} appears twice; keep one document for it")
        seen.add((p.kind.name, p.name))
    parsed.sort(key=docs.order_key)

    plan = []  # (parsed, stored or None, diff)
    for p in parsed:
        stored = _stored(state.store, p.kind, p.name)
        diff = docs.spec_diff(p.given, stored) if stored is not None else []
        why = docs.refusal(p.kind, p.name, diff) if diff else None
        if why:
            raise Conflict(why, code="immutable")
        plan.append((p, stored, diff))

    results = []
    for p, stored, diff in plan:
        action = "created" if stored is None else ("updated" if diff else "unchanged")
        if not body.dry_run and action == "created":
            p.kind.create(state, who, p.kind.schema.model_validate(p.body))
        elif not body.dry_run and action == "updated":
            changes = {d["field"]: d["to"] for d in diff}
            if p.kind.update:
                p.kind.update(state, who, p.name, changes)
            else:
                merge(state, _records(p.kind), p.name, changes, label=p.kind.name,
                      event_kind=p.kind.plural.rstrip("s"))
        results.append({"kind": p.kind.name, "name": p.name, "action": action, "diff": diff})
    return {"dry_run": body.dry_run, "results": results}
