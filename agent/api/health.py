"""Health and metrics.

    GET    /v1/health    the node's view: driver, dataplane, GPUs, VMs, and every reason it is degraded
    GET    /healthz      liveness in the shape every Fabric process shares (common.health)
    GET    /metrics      Prometheus text; the model routes' gauges are refreshed at scrape time
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent.state import AgentState, read_inventory, read_kvm
from common.agent_api import AgentHealth
from common.health import healthz_body


def health_router(state: AgentState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/health", response_model=AgentHealth)
    def health() -> AgentHealth:
        inv = read_inventory(state.inventory)
        vms = state.vm_driver.list()
        kvm = read_kvm(state.kvm)
        kvm_note = f"KVM not usable: {kvm.reason}" if kvm is not None and not kvm.usable else ""
        withdrawn = state.fail_closed.withdrawn if state.fail_closed is not None else ""
        notes = [m for m in (inv.message, state.dataplane_message, kvm_note, withdrawn) if m]
        return AgentHealth(node_id=state.node_id, ok=True, vm_driver=state.vm_driver.name,
                           dataplane=state.dataplane is not None, gpus=len(inv.gpus), vms=len(vms),
                           message="; ".join(notes) or "ok", services_withdrawn=withdrawn)

    @router.get("/healthz")
    def healthz() -> JSONResponse:
        """Liveness in the shape every Fabric process shares (common.health)."""
        status, body = healthz_body("fabric-agent", {
            "vm_driver": f"ok: {state.vm_driver.name}",
            "dataplane": "ok: loaded" if state.dataplane is not None else f"off: {state.dataplane_message or 'not loaded'}",
        })
        return JSONResponse(body, status_code=status)

    @router.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:
        refresh = getattr(request.app.state, "refresh_model_metrics", None)
        if refresh is not None:
            refresh()
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    return router
