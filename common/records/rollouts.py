"""Revision and rollout records in the store (thin helpers; the decisions live in controlplane.rollouts.plan).

Revisions are written with create-if-absent at the next number, so two writers never produce
the same revision and a record, once written, is never changed except ``superseded_at``.
What a caller can grow is bounded: beyond KEEP_REVISIONS the oldest superseded revisions go,
beyond KEEP_ROLLOUTS the oldest finished rollouts (the active one and revisions in use stay).
Rollouts are numbered per deployment the same way; at most one is active (the API refuses a
second one with 409; the create-if-absent on the next number closes the race between two).
Updates of a rollout record are compare-and-swap against the version that was read.
"""

from __future__ import annotations

from common import keyspace
from common.errors import NotFound
from common.records import cas, deployments, reading
from common.records.cas import Contended
from common.rollouts import Revision, Rollout
from common.schemas import InferenceDeployment, Template
from common.store.base import Store

KEEP_REVISIONS = 100  # beyond this, the oldest superseded revisions are dropped
KEEP_ROLLOUTS = 50  # beyond this, the oldest finished rollouts are dropped


def template_of(dep: InferenceDeployment) -> Template:
    return Template(model=dep.model, profile=dep.profile, engine_args=list(dep.engine_args))


def list_revisions(store: Store, deployment: str) -> list[Revision]:
    return sorted(reading.each(Revision, store.list(keyspace.revisions(deployment)), "revision"),
                  key=lambda r: r.revision)


def get_revision(store: Store, deployment: str, revision: int) -> Revision | None:
    kv = store.get(keyspace.revisions(deployment, revision))
    return None if kv is None else reading.one(Revision, kv, "revision")


def write_revision(store: Store, deployment: str, template: Template, *, who: str, reason: str,
                   now: float) -> Revision:
    """Revision N+1 of ``deployment`` (1 when it has none), taken with create-if-absent."""
    def attempt() -> Revision | None:
        existing = list_revisions(store, deployment)
        number = existing[-1].revision + 1 if existing else 1
        rev = Revision(deployment=deployment, revision=number, template=template, created_at=now,
                       who=who, reason=reason)
        if not store.create(keyspace.revisions(deployment, number), rev.model_dump_json()):
            return None
        surplus = len(existing) + 1 - KEEP_REVISIONS
        for old in [r for r in existing if r.superseded_at is not None][:max(0, surplus)]:
            store.delete(keyspace.revisions(deployment, old.revision))
        return rev

    return cas.retry(attempt, f"revisions of {deployment!r} changed too often; try again")


def mark_superseded(store: Store, deployment: str, revision: int, now: float) -> None:
    kv = store.get(keyspace.revisions(deployment, revision))
    rev = None if kv is None else reading.one(Revision, kv, "revision")
    if kv is not None and rev is not None and rev.superseded_at is None:
        store.cas(kv.key, rev.model_copy(update={"superseded_at": now}).model_dump_json(), kv.mod_revision)


def list_rollouts(store: Store, deployment: str) -> list[tuple[Rollout, int]]:
    """(record, mod_revision), oldest first."""
    out = [(rec, kv.mod_revision) for kv, rec in reading.pairs(Rollout, store.list(keyspace.rollouts(deployment)), "rollout")]
    return sorted(out, key=lambda p: p[0].id)


def active_rollout(store: Store, deployment: str) -> Rollout | None:
    recs = list_rollouts(store, deployment)
    return recs[-1][0] if recs and recs[-1][0].active else None


def active_rollouts(store: Store) -> dict[str, tuple[Rollout, int]]:
    """deployment -> (its active rollout, mod_revision)."""
    newest: dict[str, tuple[Rollout, int]] = {}
    for kv, rec in reading.pairs(Rollout, store.list(keyspace.rollouts()), "rollout"):
        if rec.deployment not in newest or rec.id > newest[rec.deployment][0].id:
            newest[rec.deployment] = (rec, kv.mod_revision)
    return {d: p for d, p in newest.items() if p[0].active}


def rollout_users(store: Store, field: str, name: str) -> list[str]:
    """Deployments whose active rollout moves to or from a revision whose template's ``field``
    (model or profile) is ``name``: deleting it would strand that rollout."""
    out = []
    for dep, (rec, _mod) in active_rollouts(store).items():
        for number in (rec.from_revision, rec.to_revision):
            rev = get_revision(store, dep, number)
            if rev is not None and getattr(rev.template, field) == name:
                out.append(dep)
                break
    return sorted(out)


def create_rollout(store: Store, record: Rollout) -> bool:
    return store.create(keyspace.rollouts(record.deployment, record.id), record.model_dump_json())


def prune_rollouts(store: Store, deployment: str) -> None:
    """Keep the newest KEEP_ROLLOUTS records; only finished ones are dropped."""
    recs = list_rollouts(store, deployment)
    for rec, mod in [p for p in recs if not p[0].active][: max(0, len(recs) - KEEP_ROLLOUTS)]:
        store.delete(keyspace.rollouts(deployment, rec.id), mod_revision=mod)


def save_rollout(store: Store, record: Rollout, mod_revision: int) -> bool:
    """Compare-and-swap: False when someone (an operator action) changed it since it was read."""
    return store.cas(keyspace.rollouts(record.deployment, record.id), record.model_dump_json(), mod_revision)


def update_rollout(store: Store, deployment: str, rollout_id: int, mutate) -> Rollout:
    """Compare-and-swap ``mutate`` (the new record, or None: leave it) onto one rollout record.
    NotFound when it is absent; cas.Contended when every try lost a race."""
    return cas.update(store, keyspace.rollouts(deployment, rollout_id), Rollout, mutate, kind="rollout",
                      name=f"{deployment}/{rollout_id}",
                      busy=f"rollout {rollout_id} changed too often; try again")


def get_rollout(store: Store, deployment: str, rollout_id: int) -> tuple[Rollout, int] | None:
    kv = store.get(keyspace.rollouts(deployment, rollout_id))
    return None if kv is None else (reading.one(Rollout, kv, "rollout"), kv.mod_revision)


def forget(store: Store, deployment: str) -> None:
    """Drop the revisions and rollouts of a deployment that is gone."""
    store.delete_prefix(keyspace.rollouts(deployment))
    store.delete_prefix(keyspace.revisions(deployment))


def activate(store: Store, deployment: str, revision: Revision) -> bool:
    """The deployment record now names the revision and its template (CAS on the spec)."""
    t = revision.template

    def name_it(dep):
        return dep.model_copy(update={"revision": revision.revision, "model": t.model, "profile": t.profile,
                                      "engine_args": list(t.engine_args)})

    try:
        deployments.update(store, deployment, name_it)
    except (NotFound, Contended):
        return False
    return True
