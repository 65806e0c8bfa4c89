"""Batch job operations (controlplane.batches.jobs has the states and rules): create, the moves
claim / finish / cancel, and deleting a finished record.

  - A batch names a deployment that exists (422); at most FABRIC_MAX_BATCHES records are kept, a
    create beyond that is 429 until finished ones are deleted.
  - Each move is a compare-and-swap on the job's record, so two callers racing to claim or finish
    one job get one success and one 409.
  - Only a finished record is deleted (409 not_finished), and only as it was read (409 contended).
Each create and move is an event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from common.errors import Conflict, Contended, InvalidInput, LimitExceeded, NotFound
from common.records import batches, deployments, replicas
from controlplane.batches.jobs import FINISHED, BatchCreate, BatchJob, cancel, claim, finish, new_job
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


def load(ctx: AppState, batch_id: str) -> tuple[BatchJob, int]:
    found = batches.versioned(ctx.store, batch_id)
    if found is None:
        raise NotFound(f"batch {batch_id!r} not found")
    return found


def create(ctx: AppState, caller: Principal | None, body: BatchCreate) -> BatchJob:
    if not deployments.exists(ctx.store, body.deployment):
        raise InvalidInput(f"deployment {body.deployment!r} does not exist")
    limit = ctx.settings.max_batches  # FABRIC_MAX_BATCHES
    if batches.count(ctx.store) >= limit:
        raise LimitExceeded(f"{limit} batch records are kept at most (FABRIC_MAX_BATCHES); delete finished ones",
                            retry_after=60)
    job = new_job(body)
    try:
        job = batches.create(ctx.store, job)
    except Conflict:
        raise Contended(f"batch id {job.id} collided; try again") from None
    common.event(ctx, "batch", job.id, "queued", f"batch {job.id} for deployment {job.deployment}", tenant=job.tenant)
    return job


def _move(ctx: AppState, batch_id: str, step: Callable[[BatchJob], BatchJob]) -> BatchJob:
    moved = batches.update(ctx.store, batch_id, step,
                           busy=f"batch {batch_id} changed too often; try again")
    common.event(ctx, "batch", batch_id, moved.state, moved.message, tenant=moved.tenant)
    return moved


def claim_job(ctx: AppState, caller: Principal | None, batch_id: str) -> BatchJob:
    """queued -> running; needs a ready replica of its deployment that is not draining."""
    return _move(ctx, batch_id, lambda job: claim(job, replicas.list(ctx.store, job.deployment), time.time()))


def finish_job(ctx: AppState, caller: Principal | None, batch_id: str, ok: bool) -> BatchJob:
    return _move(ctx, batch_id, lambda job: finish(job, ok, time.time()))


def cancel_job(ctx: AppState, caller: Principal | None, batch_id: str) -> BatchJob:
    return _move(ctx, batch_id, lambda job: cancel(job, time.time()))


def delete(ctx: AppState, caller: Principal | None, batch_id: str) -> None:
    job, rev = load(ctx, batch_id)
    if job.state not in FINISHED:
        raise Conflict(f"batch {batch_id} is {job.state}; cancel it before deleting the record", code="not_finished")
    if not batches.discard(ctx.store, batch_id, mod_revision=rev):
        raise Contended(f"batch {batch_id} changed meanwhile; try again")
