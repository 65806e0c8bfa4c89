"""Batch job records (controlplane/batches/jobs.py has the states and rules). Admin token.

    POST /api/ai/batches                 {"deployment", "input_sha256"} -> 201, state queued
    GET  /api/ai/batches[?deployment=&state=]
    GET  /api/ai/batches/{id}
    DELETE /api/ai/batches/{id}          a finished record (409 while queued or running)
    POST /api/ai/batches/{id}/claim      queued -> running (needs a ready, not draining replica)
    POST /api/ai/batches/{id}/finish     {"ok": true|false}: running -> succeeded | failed
    POST /api/ai/batches/{id}/cancel     queued | running -> cancelled (409 once finished)

Each move is a compare-and-swap on the job's record, so two callers racing to claim or finish
one job get one success and one 409. At most FABRIC_MAX_BATCHES records are kept (default
10000): a create beyond that is 429 until old records are deleted with DELETE.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import APIRouter, Depends, Query

from common.errors import Conflict, InvalidInput, LimitExceeded, NotFound
from common.schemas import Replica
from controlplane.api.answers import Deleted
from controlplane.auth import require_admin
from controlplane.batches.jobs import (
    FINISHED,
    STATES,
    BatchCreate,
    BatchFinish,
    BatchJob,
    cancel,
    claim,
    finish,
    new_job,
)
from controlplane.events import record_event
from controlplane.records import batches, deployments, replicas
from controlplane.settings import of as settings_of
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["batches"], dependencies=[Depends(require_admin)])
CAS_RETRIES = 8


def _load(state: AppState, batch_id: str) -> tuple[BatchJob, int]:
    found = batches.versioned(state.store, batch_id)
    if found is None:
        raise NotFound(f"batch {batch_id!r} not found")
    return found


def _replicas(state: AppState, deployment: str) -> list[Replica]:
    return replicas.list(state.store, deployment)


def _move(state: AppState, batch_id: str, step: Callable[[BatchJob], BatchJob]) -> BatchJob:
    moved = batches.update(state.store, batch_id, step, retries=CAS_RETRIES,
                           busy=f"batch {batch_id} changed too often; try again")
    record_event(state.store, "batch", batch_id, moved.state, moved.message, tenant=moved.tenant,
                 keep=state.settings.events_kept)
    return moved


@router.post("/batches", status_code=201, response_model=BatchJob)
def create_batch(body: BatchCreate, state: StateDep) -> BatchJob:
    if not deployments.exists(state.store, body.deployment):
        raise InvalidInput(f"deployment {body.deployment!r} does not exist")
    limit = settings_of(state).max_batches  # FABRIC_MAX_BATCHES
    if batches.count(state.store) >= limit:
        raise LimitExceeded(f"{limit} batch records are kept at most (FABRIC_MAX_BATCHES); delete finished ones",
                            retry_after=60)
    job = new_job(body)
    try:
        job = batches.create(state.store, job)
    except Conflict:
        raise Conflict(f"batch id {job.id} collided; try again", code="contended") from None
    record_event(state.store, "batch", job.id, "queued", f"batch {job.id} for deployment {job.deployment}",
                 tenant=job.tenant, keep=state.settings.events_kept)
    return job


@router.get("/batches", response_model=list[BatchJob])
def list_batches(state: StateDep, deployment: str | None = None,
                 phase: str | None = Query(None, alias="state")) -> list[BatchJob]:
    if phase is not None and phase not in STATES:
        raise InvalidInput(f"state {phase!r} is unknown; expected one of {', '.join(STATES)}")
    jobs = batches.list(state.store)
    return sorted((j for j in jobs if deployment in (None, j.deployment) and phase in (None, j.state)),
                  key=lambda j: (j.created_at, j.id))


@router.get("/batches/{batch_id}", response_model=BatchJob)
def get_batch(batch_id: str, state: StateDep) -> BatchJob:
    return _load(state, batch_id)[0]


@router.post("/batches/{batch_id}/claim", response_model=BatchJob)
def claim_batch(batch_id: str, state: StateDep) -> BatchJob:
    return _move(state, batch_id, lambda job: claim(job, _replicas(state, job.deployment), time.time()))


@router.post("/batches/{batch_id}/finish", response_model=BatchJob)
def finish_batch(batch_id: str, body: BatchFinish, state: StateDep) -> BatchJob:
    return _move(state, batch_id, lambda job: finish(job, body.ok, time.time()))


@router.post("/batches/{batch_id}/cancel", response_model=BatchJob)
def cancel_batch(batch_id: str, state: StateDep) -> BatchJob:
    return _move(state, batch_id, lambda job: cancel(job, time.time()))


@router.delete("/batches/{batch_id}", response_model=Deleted)
def delete_batch(batch_id: str, state: StateDep) -> dict:
    job, rev = _load(state, batch_id)
    if job.state not in FINISHED:
        raise Conflict(f"batch {batch_id} is {job.state}; cancel it before deleting the record", code="not_finished")
    if not batches.discard(state.store, batch_id, mod_revision=rev):
        raise Conflict(f"batch {batch_id} changed meanwhile; try again", code="contended")
    return {"kind": "batch", "name": batch_id, "deleted": True}
