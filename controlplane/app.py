"""The fabricd FastAPI application: `create_app(state)`.

The state is passed in and reachable from routes via controlplane.state.get_state; nothing is a
module global. The lifespan starts the background controllers when `controlplane.controllers`
exists (its `start(state)` returns a handle with `stop()`), so the API alone runs without them.
/metrics serves Prometheus text from the app's own registry, with request counts by route
template (never the raw path, so names do not explode label cardinality) and status.
"""

from __future__ import annotations

import hmac
import importlib
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from common import runtime_metrics
from common.health import healthz_body
from common.records import reading
from controlplane import console, log_redact, openapi_doc
from controlplane.api import routers
from controlplane.auth import ensure_token_secret
from controlplane.cluster_metrics import ClusterCollector
from controlplane.errors_http import install_error_handlers, internal_error
from controlplane.request_guard import RequestGuard
from controlplane.state import AppState

log = logging.getLogger("fabricd")
CONTROLLERS_MODULE = "controlplane.controllers"


def _load_controllers():
    try:
        return importlib.import_module(CONTROLLERS_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != CONTROLLERS_MODULE:
            raise
        return None


def create_app(state: AppState) -> FastAPI:
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)

    runtime = runtime_metrics.install(state.registry)
    reading.install(state.registry)  # records a store listing skipped (fabric_records_unreadable_total{kind})

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runtime.bind()
        log_redact.install()  # the admission webhook's token is in its path: never in the access log
        controllers = _load_controllers() if state.settings.run_controllers else None
        handle = None
        if controllers is not None:
            handle = controllers.start(state)
            state.controllers_running = True
            log.info("controllers started")
        try:
            yield
        finally:
            if handle is not None:
                handle.stop()
                state.controllers_running = False

    app = FastAPI(title="fabricd", version="0.1.0", lifespan=lifespan,
                  description="Fabric control plane: models, profiles, deployments, endpoints.")
    app.state.fabric = state
    install_error_handlers(app)
    # Calls without valid credentials (401), oversized bodies (413) and lone surrogates (422) are
    # refused before any route reads them.
    app.add_middleware(RequestGuard, max_body_bytes=state.settings.max_body_bytes, state=state)

    requests_total = Counter("fabricd_http_requests_total", "HTTP requests by route template and status",
                             ["method", "route", "status"], registry=state.registry)
    state.registry.register(ClusterCollector(state.store))
    latency = Histogram("fabricd_http_request_seconds", "HTTP request latency by route template",
                        ["method", "route"], registry=state.registry)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        started = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception as exc:  # noqa: BLE001 - a bug: answered 500 here, logged once, counted
            # Handled here rather than by Starlette's outermost handler, which re-raises after
            # answering, so uvicorn logged the same traceback a second time.
            response = internal_error(request, exc)
        # The matched route's template (e.g. /api/ai/models/{name}), set by the router.
        template = getattr(request.scope.get("route"), "path", "unmatched")
        latency.labels(request.method, template).observe(time.perf_counter() - started)
        requests_total.labels(request.method, template, str(response.status_code)).inc()
        return response

    for router in routers():
        app.include_router(router)
    console.install(app)
    openapi_doc.install(app)

    metrics_token = state.settings.metrics_token  # read once, at start

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        """Prometheus text; with FABRIC_METRICS_TOKEN set, only for `Authorization: Bearer` that token."""
        sent = request.headers.get("authorization", "").encode()
        if metrics_token and not hmac.compare_digest(sent, f"Bearer {metrics_token}".encode()):
            return JSONResponse({"error": {"code": "no_token", "message": "/metrics needs Authorization: "
                                           "Bearer FABRIC_METRICS_TOKEN"}}, status_code=401)
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"])
    def healthz() -> JSONResponse:
        """Liveness in the shape every Fabric process shares (common.health)."""
        try:
            state.store.revision()
            store = "ok"
        except Exception as exc:  # noqa: BLE001 - any store failure is what this check reports
            store = f"failed: {type(exc).__name__}"
        status, body = healthz_body("fabricd", {
            "store": store, "controllers": "ok: running" if state.controllers_running else "off"})
        return JSONResponse(body, status_code=status)

    return app
