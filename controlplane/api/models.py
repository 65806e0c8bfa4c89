"""Model supply chain API (admin token): jobs, status, materialize, verify, cache eviction.

  GET  /api/ai/model-jobs                   every job record (one per model and node)
  GET  /api/ai/models/{name}/status         phase, digest, resolved commit, bytes done/total,
                                            files, and per node: job state, progress, cached
  POST /api/ai/models/{name}/materialize    {"nodes": [..]} (default: every online node) records
                                            a job per node and returns at once (202); a Failed
                                            job is retried (attempt and retries + 1)
  POST /api/ai/models/{name}/verify         the agents hash and scan the cached bytes again and
                                            apply the model's checksum and signature rules; a
                                            node that fails has its job set Failed
  POST /api/ai/models/cache/evict           {"budget_bytes": N, "nodes": [..]} or
                                            FABRIC_MODEL_CACHE_BYTES: per node, deletes least
                                            recently used digests no deployment's model names
                                            until the cache fits; the model records remain
Each POST is an operation of controlplane.ops.model_jobs; the jobs run outside the request:
controlplane.models.worker drives them on the agents.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, create_model

from common.model_api import ModelJob
from common.records import models as model_records
from common.records import nodes as node_records
from common.records.model_jobs import list_jobs
from common.schemas import Node, Spec
from controlplane.auth import PrincipalDep, require_admin
from controlplane.models import plan
from controlplane.ops import model_jobs as job_ops
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["models"], dependencies=[Depends(require_admin)])


class MaterializeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[str] | None = Field(None, description="nodes to materialize on (default: every online node)")


class EvictRequest(Spec):
    budget_bytes: int | None = Field(None, ge=0, le=2**62, description="per-node cache budget (default FABRIC_MODEL_CACHE_BYTES)")
    nodes: list[str] | None = None


# A job as the API shows it: its id (model/node) first, then every field of the record.
JobView = create_model("JobView", __doc__="A model job and its id (model/node).",
                       id=(str, Field(..., description="model/node")),
                       **{n: (f.annotation, f) for n, f in ModelJob.model_fields.items()})


class Materializing(BaseModel):
    model: str
    jobs: list[JobView]  # type: ignore[valid-type]


class NodeCopy(BaseModel):
    node: str
    state: str
    message: str
    bytes_done: int
    bytes_total: int
    files: int
    digest: str | None
    retries: int
    joined: str | None
    adapters: dict[str, str | None] = Field(..., description="adapter name -> the digest fetched")
    cached: bool = Field(..., description="the node's agent reports the digest in its model cache")


class ModelStatusView(BaseModel):
    name: str
    source: str
    state: str
    message: str | None
    digest: str | None
    revision: str | None
    bytes_done: int = Field(..., description="the most advanced node's")
    bytes_total: int
    files: int
    adapters: list[str]
    adapter_revisions: dict[str, str]
    nodes: list[NodeCopy]


class Verified(BaseModel):
    node: str
    ok: bool | None = Field(..., description="null: the agent was unreachable")
    digest: str | None = None
    message: str


class VerifyAnswer(BaseModel):
    model: str
    results: list[Verified]


class EvictionRow(BaseModel):
    node: str
    digest: str
    size_bytes: int
    reason: str


class EvictAnswer(BaseModel):
    budget_bytes: int
    evicted: list[EvictionRow]
    kept: list[EvictionRow]
    over_budget: dict[str, int] = Field(..., description="node -> bytes still above the budget")
    errors: list[str]


def _nodes(state: AppState) -> dict[str, Node]:
    return {n.id: n for n in node_records.list(state.store)}


def _job_view(job: ModelJob) -> dict:
    return {"id": job.id, **job.model_dump(mode="json")}


@router.get("/model-jobs", response_model=list[JobView])
def model_jobs(state: StateDep) -> list[dict]:
    return [_job_view(j) for j in list_jobs(state.store)]


@router.get("/models/{name}/status", response_model=ModelStatusView)
def model_status(name: str, state: StateDep) -> dict:
    model = model_records.require(state.store, name)
    jobs = list_jobs(state.store, name)
    nodes = _nodes(state)
    best = max(jobs, key=lambda j: (plan.STATE_ORDER.get(j.state, 0), j.bytes_done), default=None)
    return {
        "name": name, "source": model.source, "state": model.status.phase, "message": model.status.message,
        "digest": model.status.digest, "revision": model.status.revision,
        "bytes_done": best.bytes_done if best else 0, "bytes_total": best.bytes_total if best else 0,
        "files": best.files if best else 0,
        "adapters": [a.name for a in model.adapters], "adapter_revisions": model.status.adapter_revisions,
        "nodes": [{"node": j.node, "state": j.state, "message": j.message, "bytes_done": j.bytes_done,
                   "bytes_total": j.bytes_total, "files": j.files, "digest": j.digest, "retries": j.retries,
                   "joined": j.joined, "adapters": {n: a.digest for n, a in sorted(j.adapters.items())},
                   "cached": bool(j.digest and j.node in nodes and j.digest in nodes[j.node].cached_models)}
                  for j in jobs],
    }


@router.post("/models/{name}/materialize", status_code=202, response_model=Materializing)
def materialize(name: str, state: StateDep, who: PrincipalDep, body: MaterializeRequest | None = None) -> dict:
    jobs = job_ops.materialize(state, who, name, (body or MaterializeRequest()).nodes)
    return {"model": name, "jobs": [_job_view(j) for j in jobs]}


@router.post("/models/{name}/verify", response_model=VerifyAnswer, response_model_exclude_unset=True)
async def verify(name: str, state: StateDep, who: PrincipalDep) -> dict:
    return {"model": name, "results": await job_ops.verify(state, who, name)}


@router.post("/models/cache/evict", response_model=EvictAnswer)
async def evict(body: EvictRequest, state: StateDep, who: PrincipalDep) -> dict:
    done = await job_ops.evict(state, who, body.budget_bytes, body.nodes)

    def rows(items):
        return [{"node": e.node, "digest": e.digest, "size_bytes": e.size_bytes, "reason": e.reason} for e in items]

    return {"budget_bytes": done.budget_bytes, "evicted": rows(done.evicted), "kept": rows(done.kept),
            "over_budget": done.over_budget, "errors": list(done.errors)}
