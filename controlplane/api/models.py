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
The jobs run outside the request: controlplane.models.worker drives them on the agents.
"""

from __future__ import annotations

import contextlib
import time

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, create_model

from common.errors import Conflict, Contended, FabricError, InvalidInput, NotFound, TransientError
from common.model_api import ModelJob, VerifyRequest
from common.records import deployments
from common.records import models as model_records
from common.records import nodes as node_records
from common.records.events import record_event
from common.records.model_jobs import (
    create_job,
    delete_jobs,
    get_job,
    list_jobs,
    put_job,
    restart_job,
)
from common.schemas import ModelArtifact, Node, Spec
from controlplane.auth import require_admin
from controlplane.models import plan
from controlplane.models.worker import refresh_model_status
from controlplane.placement.scheduler import node_online
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["models"], dependencies=[Depends(require_admin)])


class MaterializeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[str] | None = Field(None, description="nodes to materialize on (default: every online node)")


class VerifyModelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


def _model(state: AppState, name: str) -> ModelArtifact:
    model = model_records.get(state.store, name)
    if model is None:
        raise NotFound(f"model {name!r} not found")
    return model


def _nodes(state: AppState) -> dict[str, Node]:
    return {n.id: n for n in node_records.list(state.store)}


@contextlib.asynccontextmanager
async def _agents(state: AppState):
    if state.agents is not None:
        yield state.agents
        return
    from controlplane.agent_client import AgentClients

    clients = AgentClients(state.state_dir, insecure=state.settings.insecure)
    try:
        yield clients
    finally:
        await clients.aclose()


def _job_view(job: ModelJob) -> dict:
    return {"id": job.id, **job.model_dump(mode="json")}


@router.get("/model-jobs", response_model=list[JobView])
def model_jobs(state: StateDep) -> list[dict]:
    return [_job_view(j) for j in list_jobs(state.store)]


@router.get("/models/{name}/status", response_model=ModelStatusView)
def model_status(name: str, state: StateDep) -> dict:
    model = _model(state, name)
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
def materialize(name: str, state: StateDep, body: MaterializeRequest | None = None) -> dict:
    model = _model(state, name)
    nodes = _nodes(state)
    body = body or MaterializeRequest()
    if body.nodes is not None:
        unknown = [n for n in body.nodes if n not in nodes]
        if unknown:
            raise InvalidInput(f"unknown nodes: {', '.join(unknown)}", code="unknown_node")
        targets = sorted(set(body.nodes))
    else:
        now, settings = time.time(), state.settings.scheduler
        targets = sorted(n.id for n in nodes.values() if node_online(n, now, settings) and not n.taints)
    if not targets:
        raise Conflict("no online, untainted node to materialize on", code="no_nodes")
    out = []
    for node in targets:
        job = create_job(state.store, name, node)
        if job.state == "Failed":
            job = _retry(state, job)
        out.append(_job_view(job))
    record_event(state.store, "model", name, "materialize",
                 f"model {name} materializing on {', '.join(targets)}", keep=state.settings.events_kept)
    refresh_model_status(state.store, model)
    return {"model": name, "jobs": out}


def _retry(state: AppState, job: ModelJob) -> ModelJob:
    restarted = restart_job(state.store, job.model, job.node, ("Failed",), f"retry {job.attempt + 1} requested")
    if restarted is None:
        raise Contended(f"model job {job.id} changed too often; try again")
    return restarted


@router.post("/models/{name}/verify", response_model=VerifyAnswer, response_model_exclude_unset=True)
async def verify(name: str, state: StateDep) -> dict:
    model = _model(state, name)
    nodes = _nodes(state)
    ready = [j for j in list_jobs(state.store, name) if j.state == "Ready" and j.digest]
    if not ready:
        raise Conflict(f"model {name!r} is not Ready on any node; materialize it first", code="not_ready")
    results = []
    async with _agents(state) as agents:
        for job in ready:
            node = nodes.get(job.node)
            if node is None:
                results.append({"node": job.node, "ok": False, "message": "node is not registered"})
                continue
            try:
                res = await agents.for_node(node).verify_model(VerifyRequest(
                    digest=job.digest, expected_digest=model.digest, require_checksum=bool(model.require_checksum),
                    signature=model.signature))
            except TransientError as exc:
                results.append({"node": job.node, "ok": None, "message": f"agent unreachable: {exc.message}"})
                continue
            except FabricError as exc:
                res = None
                message = exc.message
            if res is not None:
                message = res.message
            ok = res is not None and res.ok
            if not ok:
                _fail(state, job, f"verify: {message}")
            results.append({"node": job.node, "ok": ok, "digest": job.digest, "message": message})
    refresh_model_status(state.store, model)
    return {"model": name, "results": results}


def _fail(state: AppState, job: ModelJob, message: str) -> None:
    found = get_job(state.store, job.model, job.node)
    if found is None:
        return
    current, revision = found
    put_job(state.store, plan.failed(current, message, time.time()), revision)


def _budget(body: EvictRequest, state: AppState) -> int:
    if body.budget_bytes is not None:
        return body.budget_bytes
    configured = state.settings.model_cache_bytes  # FABRIC_MODEL_CACHE_BYTES, validated at start
    if configured is None:
        raise InvalidInput("give budget_bytes or set FABRIC_MODEL_CACHE_BYTES", code="no_budget")
    return configured


def referenced_digests(state: AppState) -> dict[str, list[str]]:
    """digest -> names of the models a deployment uses that have (or expect) that digest."""
    used = {dep.model for dep in deployments.list(state.store)}
    out: dict[str, list[str]] = {}
    for name in used:
        model = model_records.get(state.store, name)
        jobs = list_jobs(state.store, name)
        digests = {j.digest for j in jobs if j.digest}
        digests |= {a.digest for j in jobs for a in j.adapters.values()}  # its LoRA adapters' bytes
        if model is not None:
            digests |= {d for d in (model.digest, model.status.digest) if d}
            digests |= {a.digest for a in model.adapters if a.digest}
        for d in digests:
            out.setdefault(d, []).append(name)
    return out


@router.post("/models/cache/evict", response_model=EvictAnswer)
async def evict(body: EvictRequest, state: StateDep) -> dict:
    budget = _budget(body, state)
    nodes = _nodes(state)
    chosen = sorted(body.nodes) if body.nodes is not None else sorted(nodes)
    unknown = [n for n in chosen if n not in nodes]
    if unknown:
        raise InvalidInput(f"unknown nodes: {', '.join(unknown)}", code="unknown_node")
    errors, entries = [], {}
    async with _agents(state) as agents:
        for node_id in chosen:
            try:
                entries[node_id] = (await agents.for_node(nodes[node_id]).model_cache()).entries
            except FabricError as exc:
                errors.append(f"{node_id}: {exc.message}")
        result = plan.plan_eviction(entries, referenced_digests(state), budget)
        evicted = []
        for e in result.evict:
            try:
                await agents.for_node(nodes[e.node]).evict_model(e.digest)
            except FabricError as exc:
                errors.append(f"{e.node}: could not evict {e.digest}: {exc.message}")
                continue
            evicted.append(e)
            for job in list_jobs(state.store):
                if job.node == e.node and job.digest == e.digest:
                    delete_jobs(state.store, job.model, job.node)
    for model_name in {j.model for j in list_jobs(state.store)} | {
            m.name for m in model_records.list(state.store)}:
        model = model_records.get(state.store, model_name)
        if model is not None:
            refresh_model_status(state.store, model)
    if evicted:
        record_event(state.store, "model", "cache", "evicted",
                     f"evicted {len(evicted)} digests to fit {budget} bytes per node", keep=state.settings.events_kept)

    def rows(items):
        return [{"node": e.node, "digest": e.digest, "size_bytes": e.size_bytes, "reason": e.reason} for e in items]

    return {"budget_bytes": budget, "evicted": rows(evicted), "kept": rows(result.kept),
            "over_budget": result.over_budget, "errors": errors}
