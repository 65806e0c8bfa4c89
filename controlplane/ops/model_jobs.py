"""Model supply-chain operations: materialize, verify and evict (controlplane.models.plan decides).

materialize records a job per node (create-if-absent, so two fabricd processes make one record)
and returns at once; a Failed job is retried (a new attempt, 503 contended when it kept changing).
verify has the agents hash and scan the cached bytes again; a node that fails has its job set
Failed. evict deletes, per node, the least recently used digests no deployment's models name
until the cache fits the budget, and forgets the jobs of what went; the model records remain.
Each refreshes the models' status from their jobs; materialize and an eviction that removed
something are events. The jobs themselves run outside the request (controlplane.models.worker).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.errors import Conflict, Contended, FabricError, InvalidInput, TransientError
from common.model_api import ModelJob, VerifyRequest
from common.records import deployments, models
from common.records import nodes as node_records
from common.records.model_jobs import create_job, delete_jobs, list_jobs, restart_job, update_job
from common.schemas import Node
from controlplane.models import plan
from controlplane.models.worker import refresh_model_status
from controlplane.ops import common
from controlplane.placement.scheduler import node_online
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


@dataclass(frozen=True)
class Evicted:
    """An eviction's outcome: what went and what stayed (with why), per node the bytes still above
    the budget, and the nodes that could not be asked or could not evict."""
    budget_bytes: int
    evicted: tuple[plan.Eviction, ...]
    kept: tuple[plan.Eviction, ...]
    over_budget: dict[str, int]
    errors: tuple[str, ...]


def _nodes(ctx: AppState) -> dict[str, Node]:
    return {n.id: n for n in node_records.list(ctx.store)}


def materialize(ctx: AppState, caller: Principal | None, name: str, nodes: list[str] | None) -> list[ModelJob]:
    """A job per node of ``nodes`` (None: every online, untainted node); the jobs as stored."""
    model = models.require(ctx.store, name)
    known = _nodes(ctx)
    if nodes is not None:
        unknown = [n for n in nodes if n not in known]
        if unknown:
            raise InvalidInput(f"unknown nodes: {', '.join(unknown)}", code="unknown_node")
        targets = sorted(set(nodes))
    else:
        now, settings = time.time(), ctx.settings.scheduler
        targets = sorted(n.id for n in known.values() if node_online(n, now, settings) and not n.taints)
    if not targets:
        raise Conflict("no online, untainted node to materialize on", code="no_nodes")
    jobs = []
    for node in targets:
        job = create_job(ctx.store, name, node)
        if job.state == "Failed":
            job = _retry(ctx, job)
        jobs.append(job)
    common.event(ctx, "model", name, "materialize", f"model {name} materializing on {', '.join(targets)}")
    refresh_model_status(ctx.store, model)
    return jobs


def _retry(ctx: AppState, job: ModelJob) -> ModelJob:
    restarted = restart_job(ctx.store, job.model, job.node, ("Failed",), f"retry {job.attempt + 1} requested")
    if restarted is None:
        raise Contended(f"model job {job.id} changed too often; try again")
    return restarted


async def verify(ctx: AppState, caller: Principal | None, name: str) -> list[dict]:
    """Per node the model is Ready on: {"node", "ok", "digest", "message"}; ``ok`` None (and no
    digest) when the agent was unreachable, False without a digest when the node is unregistered."""
    model = models.require(ctx.store, name)
    nodes = _nodes(ctx)
    ready = [j for j in list_jobs(ctx.store, name) if j.state == "Ready" and j.digest]
    if not ready:
        raise Conflict(f"model {name!r} is not Ready on any node; materialize it first", code="not_ready")
    results = []
    async with common.agents(ctx) as agents:
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
                _fail(ctx, job, f"verify: {message}")
            results.append({"node": job.node, "ok": ok, "digest": job.digest, "message": message})
    refresh_model_status(ctx.store, model)
    return results


def _fail(ctx: AppState, job: ModelJob, message: str) -> None:
    now = time.time()
    update_job(ctx.store, job.model, job.node, lambda current: plan.failed(current, message, now))


def _budget(ctx: AppState, budget_bytes: int | None) -> int:
    if budget_bytes is not None:
        return budget_bytes
    configured = ctx.settings.model_cache_bytes  # FABRIC_MODEL_CACHE_BYTES, validated at start
    if configured is None:
        raise InvalidInput("give budget_bytes or set FABRIC_MODEL_CACHE_BYTES", code="no_budget")
    return configured


def referenced_digests(ctx: AppState) -> dict[str, list[str]]:
    """digest -> names of the models a deployment uses that have (or expect) that digest."""
    used = {dep.model for dep in deployments.list(ctx.store)}
    out: dict[str, list[str]] = {}
    for name in used:
        model = models.get(ctx.store, name)
        jobs = list_jobs(ctx.store, name)
        digests = {j.digest for j in jobs if j.digest}
        digests |= {a.digest for j in jobs for a in j.adapters.values()}  # its LoRA adapters' bytes
        if model is not None:
            digests |= {d for d in (model.digest, model.status.digest) if d}
            digests |= {a.digest for a in model.adapters if a.digest}
        for d in digests:
            out.setdefault(d, []).append(name)
    return out


async def evict(ctx: AppState, caller: Principal | None, budget_bytes: int | None,
                nodes: list[str] | None) -> Evicted:
    """Fit each node of ``nodes`` (None: every node) into ``budget_bytes`` (None:
    FABRIC_MODEL_CACHE_BYTES; 422 no_budget when neither is set)."""
    budget = _budget(ctx, budget_bytes)
    known = _nodes(ctx)
    chosen = sorted(nodes) if nodes is not None else sorted(known)
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise InvalidInput(f"unknown nodes: {', '.join(unknown)}", code="unknown_node")
    errors, entries = [], {}
    async with common.agents(ctx) as agents:
        for node_id in chosen:
            try:
                entries[node_id] = (await agents.for_node(known[node_id]).model_cache()).entries
            except FabricError as exc:
                errors.append(f"{node_id}: {exc.message}")
        result = plan.plan_eviction(entries, referenced_digests(ctx), budget)
        evicted = []
        for e in result.evict:
            try:
                await agents.for_node(known[e.node]).evict_model(e.digest)
            except FabricError as exc:
                errors.append(f"{e.node}: could not evict {e.digest}: {exc.message}")
                continue
            evicted.append(e)
            for job in list_jobs(ctx.store):
                if job.node == e.node and job.digest == e.digest:
                    delete_jobs(ctx.store, job.model, job.node)
    for model_name in {j.model for j in list_jobs(ctx.store)} | {m.name for m in models.list(ctx.store)}:
        model = models.get(ctx.store, model_name)
        if model is not None:
            refresh_model_status(ctx.store, model)
    if evicted:
        common.event(ctx, "model", "cache", "evicted", f"evicted {len(evicted)} digests to fit {budget} bytes per node")
    return Evicted(budget, tuple(evicted), result.kept, result.over_budget, tuple(errors))
