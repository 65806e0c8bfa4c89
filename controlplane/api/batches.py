"""Batch job records (controlplane/batches/jobs.py has the states and rules). Admin token.

    POST /api/ai/batches                 {"deployment", "input_sha256"} -> 201, state queued
    GET  /api/ai/batches[?deployment=&state=]
    GET  /api/ai/batches/{id}
    DELETE /api/ai/batches/{id}          a finished record (409 while queued or running)
    POST /api/ai/batches/{id}/claim      queued -> running (needs a ready, not draining replica)
    POST /api/ai/batches/{id}/finish     {"ok": true|false}: running -> succeeded | failed
    POST /api/ai/batches/{id}/cancel     queued | running -> cancelled (409 once finished)

Each change is an operation of controlplane.ops.batches (a move is a compare-and-swap on the job's
record: two callers racing to claim or finish one job get one success and one 409; at most
FABRIC_MAX_BATCHES records are kept, default 10000, a create beyond that is 429).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from common.errors import InvalidInput
from common.records import batches
from controlplane.api.answers import Deleted
from controlplane.auth import PrincipalDep, require_admin
from controlplane.batches.jobs import STATES, BatchCreate, BatchFinish, BatchJob
from controlplane.ops import batches as batch_ops
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["batches"], dependencies=[Depends(require_admin)])


@router.post("/batches", status_code=201, response_model=BatchJob)
def create_batch(body: BatchCreate, state: StateDep, who: PrincipalDep) -> BatchJob:
    return batch_ops.create(state, who, body)


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
    return batch_ops.load(state, batch_id)[0]


@router.post("/batches/{batch_id}/claim", response_model=BatchJob)
def claim_batch(batch_id: str, state: StateDep, who: PrincipalDep) -> BatchJob:
    return batch_ops.claim_job(state, who, batch_id)


@router.post("/batches/{batch_id}/finish", response_model=BatchJob)
def finish_batch(batch_id: str, body: BatchFinish, state: StateDep, who: PrincipalDep) -> BatchJob:
    return batch_ops.finish_job(state, who, batch_id, body.ok)


@router.post("/batches/{batch_id}/cancel", response_model=BatchJob)
def cancel_batch(batch_id: str, state: StateDep, who: PrincipalDep) -> BatchJob:
    return batch_ops.cancel_job(state, who, batch_id)


@router.delete("/batches/{batch_id}", response_model=Deleted)
def delete_batch(batch_id: str, state: StateDep, who: PrincipalDep) -> dict:
    batch_ops.delete(state, who, batch_id)
    return {"kind": "batch", "name": batch_id, "deleted": True}
