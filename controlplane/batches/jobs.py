"""Batch job records and their state machine, as pure functions over typed records.

A batch job is a record, not a runner: a client (or a worker) asks fabricd to record a job
against a deployment, claims it when it starts work, and reports how it ended. Fabric never
decides that a job succeeded by itself.

    queued --claim--> running --finish ok--> succeeded
                         |    --finish !ok--> failed
    queued|running --cancel--> cancelled

- claim needs the deployment to have a ready replica that is not draining (the replica is
  recorded on the job); claiming a job that is not queued is a conflict.
- finish needs a running job; cancel refuses a job that already finished (succeeded, failed or
  cancelled).
- Only a digest of the input is kept (`input_sha256`, 64 hex characters): the prompt or input
  file never reaches fabricd, and a body carrying any other field is refused.
"""

from __future__ import annotations

import re
import secrets
import time

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.batch_jobs import BatchJob
from common.errors import Conflict
from common.schemas import Replica, check_name

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    deployment: str
    input_sha256: str = Field(..., description="SHA-256 of the input, 64 hex characters; the input itself "
                                               "is never sent to fabricd")
    tenant: str | None = None

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        return check_name(v, "deployment")

    @field_validator("input_sha256")
    @classmethod
    def _digest(cls, v: str) -> str:
        v = v.lower() if isinstance(v, str) else v
        if not isinstance(v, str) or not SHA256_HEX.match(v):
            raise ValueError("input_sha256 must be 64 hexadecimal characters (a SHA-256 digest)")
        return v


class BatchFinish(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool


def new_job(body: BatchCreate, now: float | None = None) -> BatchJob:
    now = time.time() if now is None else now
    return BatchJob(id=f"batch-{secrets.token_hex(8)}", deployment=body.deployment, input_sha256=body.input_sha256,
                    tenant=body.tenant, created_at=now, message="queued; claim it when work starts")


def claimable_replica(replicas: list[Replica]) -> Replica | None:
    """The first ready, not draining replica (by ordinal), or None."""
    ready = [r for r in replicas if r.ready and not r.draining and r.phase != "Deleting"]
    return min(ready, key=lambda r: (r.ordinal, r.replica_id)) if ready else None


def claim(job: BatchJob, replicas: list[Replica], now: float) -> BatchJob:
    if job.state != "queued":
        raise Conflict(f"batch {job.id} is {job.state}; only a queued job can be claimed", code="not_queued")
    replica = claimable_replica(replicas)
    if replica is None:
        raise Conflict(f"deployment {job.deployment!r} has no ready replica that is not draining; "
                       "the job stays queued", code="no_ready_replica")
    return job.model_copy(update={"state": "running", "replica": replica.replica_id, "started_at": now,
                                  "message": f"claimed while replica {replica.replica_id} was ready"})


def finish(job: BatchJob, ok: bool, now: float) -> BatchJob:
    if job.state != "running":
        raise Conflict(f"batch {job.id} is {job.state}; only a running job can finish", code="not_running")
    state = "succeeded" if ok else "failed"
    return job.model_copy(update={"state": state, "finished_at": now,
                                  "message": f"reported {'success' if ok else 'failure'} by the caller"})


def cancel(job: BatchJob, now: float) -> BatchJob:
    if job.state in FINISHED:
        raise Conflict(f"batch {job.id} already finished ({job.state}); it cannot be cancelled", code="finished")
    return job.model_copy(update={"state": "cancelled", "finished_at": now,
                                  "message": f"cancelled while {job.state}"})
