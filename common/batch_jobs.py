"""The batch job record (/fabric/batches/<id>): what fabricd keeps of a job a client recorded
(controlplane.batches.jobs is its state machine)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

BatchState = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class BatchJob(BaseModel):
    id: str
    deployment: str
    input_sha256: str
    tenant: str | None = None
    state: BatchState = "queued"
    replica: str | None = Field(None, description="the replica that was ready when the job was claimed")
    message: str = ""
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
