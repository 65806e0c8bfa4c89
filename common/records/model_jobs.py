"""Model job records in the store: /fabric/model-jobs/{model}/{node} holds one ``ModelJob``.

Writes use compare-and-swap on the record's revision (the API's materialize and the model
controller both write it); creation uses create-if-absent, so two fabricd processes recording
the same job make one record. A model's own record is common.records.models.
"""

from __future__ import annotations

import time

from common import keyspace
from common.errors import NotFound
from common.model_api import ModelJob, retried
from common.records import cas, models, reading
from common.store.base import Store


def get_job(store: Store, model: str, node: str) -> tuple[ModelJob, int] | None:
    kv = store.get(keyspace.model_jobs(model, node))
    if kv is None:
        return None
    return reading.one(ModelJob, kv, "model job"), kv.mod_revision


def list_jobs(store: Store, model: str | None = None) -> list[ModelJob]:
    prefix = keyspace.model_jobs(model, "") if model else keyspace.model_jobs()
    return sorted(reading.each(ModelJob, store.list(prefix), "model job"),
                  key=lambda j: (j.model, j.node))


def create_job(store: Store, model: str, node: str, now: float | None = None) -> ModelJob:
    """Record a job (Registered) unless one exists; returns the one in the store."""
    now = time.time() if now is None else now
    job = ModelJob(model=model, node=node, created_at=now, updated_at=now,
                   history=[{"state": "Registered", "at": now, "message": "job recorded"}])
    if store.create(keyspace.model_jobs(model, node), job.model_dump_json()):
        return job
    found = get_job(store, model, node)
    return found[0] if found else job


def restart_job(store: Store, model: str, node: str, from_states: tuple[str, ...], reason: str,
                now: float | None = None) -> ModelJob | None:
    """Start a new attempt of the job if it is in one of ``from_states`` (CAS); the job as stored."""
    def retry(current: ModelJob) -> ModelJob | None:
        return retried(current, reason, time.time() if now is None else now) if current.state in from_states else None

    try:
        return cas.update(store, keyspace.model_jobs(model, node), ModelJob, retry, kind="model job",
                          name=f"{model}/{node}")
    except (NotFound, cas.Contended):
        return None


def update_job(store: Store, model: str, node: str, change
               ) -> tuple[ModelJob, ModelJob | None] | None:
    """Compare-and-swap ``change(current)`` (the new job, or None: leave it) onto one job record:
    (the job as read on the try that won, the job written or None); None when the record is gone
    or kept changing."""
    seen: list[ModelJob] = []

    def mutate(current: ModelJob) -> ModelJob | None:
        seen[:] = [current.model_copy(deep=True)]
        return change(current)

    try:
        after = cas.update(store, keyspace.model_jobs(model, node), ModelJob, mutate, kind="model job",
                           name=f"{model}/{node}")
    except (NotFound, cas.Contended):
        return None
    return seen[0], (None if after == seen[0] else after)


def put_job(store: Store, job: ModelJob, revision: int) -> bool:
    return store.cas(keyspace.model_jobs(job.model, job.node), job.model_dump_json(), revision)


def delete_jobs(store: Store, model: str, node: str | None = None) -> None:
    for kv in store.list(keyspace.model_jobs(model, "")):
        if node is None or kv.key.endswith(f"/{node}"):
            store.delete(kv.key)


def update_model_status(store: Store, name: str, **fields) -> None:
    """Set fields of a model's status (CAS; the model may be deleted meanwhile)."""
    try:
        models.update_status(store, name, **fields)
    except (NotFound, cas.Contended):
        pass
