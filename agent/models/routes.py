"""The agent's model routes (added to agent.api's app when the agent has a model cache).

    POST   /v1/models/jobs            start or join a job (idempotent by job id and attempt): 202
    GET    /v1/models/jobs[/{id}]     job views: state, progress, digest, history
    GET    /v1/models/cache           cached digests with size, last use, path; free bytes
    DELETE /v1/models/cache/{digest}  evict one digest (never a local source): 204, 404
    POST   /v1/models/verify          hash and scan a cached digest again, apply the model's rules
Metrics (refreshed at each /metrics scrape): fabric_agent_model_jobs{state},
fabric_agent_model_cache_bytes, fabric_agent_model_cache_digests.
Handlers are sync: hashing and deleting block, and FastAPI runs them in its thread pool.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Gauge

from agent.models import adapter_sets
from agent.models.checks import CheckFailed, build_manifest, check_policy, scan
from agent.models.jobs import ModelJobs
from common.errors import InvalidInput, NotFound
from common.model_api import (
    JOB_ID,
    AgentJobRequest,
    AgentJobView,
    CacheList,
    VerifyRequest,
    VerifyResult,
    check_digest,
)


def _digest(value: str) -> str:
    try:
        return check_digest(value) or ""
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def add_model_routes(app: FastAPI, jobs: ModelJobs, node_id: str, registry: CollectorRegistry) -> None:
    cache = jobs.cache
    job_gauge = Gauge("fabric_agent_model_jobs", "Model jobs on this node by state", ["state"], registry=registry)
    cache_gauge = Gauge("fabric_agent_model_cache_bytes", "Bytes of verified models in the cache (by-digest)",
                        registry=registry)
    digests_gauge = Gauge("fabric_agent_model_cache_digests", "Verified model digests on this node",
                          registry=registry)

    def refresh_metrics() -> None:
        """Read at scrape time: the job records and the cache on disk are the truth."""
        counts: dict[str, int] = {}
        for view in jobs.list():
            counts[view.state] = counts.get(view.state, 0) + 1
        job_gauge.clear()
        for state, n in counts.items():
            job_gauge.labels(state).set(n)
        entries = cache.entries()
        cache_gauge.set(sum(e.size_bytes for e in entries if not e.local))
        digests_gauge.set(len(entries))

    app.state.refresh_model_metrics = refresh_metrics

    @app.post("/v1/models/jobs", response_model=AgentJobView, status_code=202)
    def submit_job(req: AgentJobRequest) -> AgentJobView:
        return jobs.submit(req)

    @app.get("/v1/models/jobs", response_model=list[AgentJobView])
    def list_jobs() -> list[AgentJobView]:
        return jobs.list()

    @app.get("/v1/models/jobs/{job_id}", response_model=AgentJobView)
    def get_job(job_id: str) -> AgentJobView:
        view = jobs.view(job_id) if JOB_ID.match(job_id) else None
        if view is None:
            raise NotFound(f"model job {job_id} does not exist on node {node_id}")
        return view

    @app.get("/v1/models/cache", response_model=CacheList)
    def list_cache() -> CacheList:
        return CacheList(entries=cache.entries(), free_bytes=cache.free_bytes())

    @app.delete("/v1/models/cache/{digest}", status_code=204)
    def evict(digest: str) -> Response:
        if not cache.evict(_digest(digest)):
            raise NotFound(f"digest {digest} is not in the cache of node {node_id}")
        jobs.forget_digest(digest)
        adapter_sets.remove_sets_with(cache, digest)  # a set sharing the adapter's files goes too
        return Response(status_code=204)

    @app.post("/v1/models/verify", response_model=VerifyResult)
    def verify(req: VerifyRequest) -> VerifyResult:
        path = cache.any_path_for(req.digest)  # hashed again below
        if path is None:
            raise NotFound(f"digest {req.digest} is not on node {node_id}")
        try:
            manifest = build_manifest(path, jobs.settings.max_files)
            if manifest.digest != req.digest:
                raise CheckFailed("Verifying", f"the bytes on disk now hash to {manifest.digest}, "
                                               f"not {req.digest}")
            scan(path, jobs.settings.max_files)
            check_policy(manifest.digest, expected_digest=req.expected_digest,
                         require_checksum=req.require_checksum, signature=req.signature,
                         signing_key=jobs.settings.signing_key)
        except CheckFailed as exc:
            return VerifyResult(ok=False, digest=req.digest, message=f"{exc.stage}: {exc.message}")
        return VerifyResult(ok=True, digest=req.digest,
                            message=f"{len(manifest.entries)} files, {manifest.size} bytes verified")
