"""The agent's HTTP API (served over mutual TLS by `fabric-agent serve`): one router per family,
composed by ``create_app``.

    GET    /v1/gpus, POST /v1/gpus/{bdf}/bind | /release            GPUs and VFIO (gpus.py)
    GET    /v1/operations/{id}                                     a long operation (operations.py)
    GET    /v1/vms, POST /v1/vms, GET|DELETE /v1/vms/{id}, GET /v1/vms/{id}/logs    VMs (vms.py)
    PUT|GET|DELETE /v1/maglev/services[/{vip}/{port}/{proto}]       Maglev services (maglev.py)
    GET    /v1/bgp                                                 VIPs announced, sessions, events (bgp.py)
    POST   /v1/gpus/{bdf}/mig, DELETE /v1/gpus/{bdf}/mig/{gi}/{ci}  MIG instances (agent/mig_routes.py)
    /v1/models...                                                  the model cache (agent/models/routes.py)
    POST   /v1/kv-index/match, GET /v1/kv-index, GET /v1/kv-index/tokenizer/{digest}
                                                     the replicas' KV blocks, models' tokenizers (agent/kv_index/routes.py)
    GET    /v1/health, GET /healthz (common.health's shape), GET /metrics          (health.py)

Who may call (callers.py): TLS admits only certificates from the cluster CA (the server demands
one), and every node holds such a certificate, so the app also checks the certificate's common
name against ``allowed_client_cns`` (default ``fabricd``, the control plane's client certificate)
and its role (common.pki: ``fabricd``, or ``tool`` for an operator's extra CN): any other CN or
role, a node's included, gets 403 ``caller_not_allowed``. The CNs in ``kv_index_cns`` (default
``fabric-gateway``: the gateways' client certificate, role ``gateway``) may call /v1/kv-index/*
and nothing else. The app sees the certificate only when served with
``common.peer_cert.PeerCertH11Protocol`` (``fabric-agent serve`` does); an HTTPS request without
it is refused rather than let through unchecked. Plain HTTP (``--insecure``, loopback only) has
no certificate to check. Handlers are sync on purpose: sysfs writes, libvirt and BPF map updates
block, and FastAPI runs sync handlers in its thread pool. Errors are FabricErrors rendered as
{"error": {"code", "message"}} (errors.py).
"""

from __future__ import annotations

from collections.abc import Collection

from fastapi import FastAPI

from agent.api.bgp import bgp_router
from agent.api.callers import (
    DEFAULT_ALLOWED_CLIENT_CNS,
    DEFAULT_KV_INDEX_CNS,
    caller_refusal,
    refuse_other_callers,
)
from agent.api.errors import add_error_handlers, document_errors
from agent.api.gpus import gpus_router
from agent.api.health import health_router
from agent.api.maglev import maglev_router
from agent.api.metrics import install_metrics
from agent.api.operations import operations_router
from agent.api.vms import vms_router
from agent.mig_routes import mig_router
from agent.operations import Operations
from agent.state import AgentState
from common import runtime_metrics

__all__ = ["DEFAULT_ALLOWED_CLIENT_CNS", "DEFAULT_KV_INDEX_CNS", "caller_refusal", "create_app"]


def create_app(state: AgentState, *, allowed_client_cns: Collection[str] = DEFAULT_ALLOWED_CLIENT_CNS,
               kv_index_cns: Collection[str] = DEFAULT_KV_INDEX_CNS) -> FastAPI:
    runtime = runtime_metrics.install(state.registry)
    app = FastAPI(title="fabric-agent", docs_url=None, redoc_url=None, lifespan=runtime_metrics.lifespan(runtime))
    app.state.agent = state
    operations = Operations()
    app.state.operations = operations
    # The caller check first, so the request counter (the outer middleware) also counts refusals.
    refuse_other_callers(app, allowed_client_cns, kv_index_cns)
    gauges = install_metrics(app, state)
    add_error_handlers(app)

    app.include_router(gpus_router(state, operations, gauges.gpus))
    app.include_router(operations_router(state, operations))
    app.include_router(vms_router(state, operations, gauges.vms))
    app.include_router(maglev_router(state))
    app.include_router(bgp_router(state))
    if state.models is not None:
        from agent.models.routes import add_model_routes

        add_model_routes(app, state.models, state.node_id, state.registry)
    app.include_router(health_router(state))
    app.include_router(mig_router(is_enabled=lambda: state.settings.pci_mig))  # FABRIC_PCI_MIG
    if state.kv_index is not None:
        from agent.kv_index.routes import kv_index_router
        from agent.kv_index.service import runs_simulators

        models = state.models
        app.include_router(kv_index_router(
            state.kv_index.subscriber, model_dir=models.cache.any_path_for if models is not None else None,
            manifest=models.cache.manifest_text if models is not None else None,
            simulated=runs_simulators(state.vm_driver), blind_after_s=state.kv_index.blind_after_s))
    document_errors(app)
    return app
