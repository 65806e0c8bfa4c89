"""The agent API's own metrics: requests by route template and code, and the inventory gauges the
GPU and VM routes refresh when they are read."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI, Request
from prometheus_client import Counter, Gauge

from agent.state import AgentState


@dataclass(frozen=True)
class ApiGauges:
    gpus: Gauge  # GPUs in the inventory, set by GET /v1/gpus
    vms: Gauge   # VMs by state, set by GET /v1/vms


def install_metrics(app: FastAPI, state: AgentState) -> ApiGauges:
    """Registers the API's metrics on the agent's registry (and the dataplane's collector when it
    has one), and counts every request by route template, refused callers included when this runs
    after the caller check is installed (the later middleware is the outer one)."""
    requests = Counter("fabric_agent_requests", "Agent API requests", ["route", "code"],
                       registry=state.registry)
    gpus = Gauge("fabric_agent_gpus", "GPUs in the inventory", registry=state.registry)
    if state.fail_closed is not None:
        Gauge("fabric_agent_fail_closed", "1 while the Maglev services are withdrawn: a fail-closed site's link "
              "to fabricd is down (agent.fail_closed)", registry=state.registry).set_function(
            lambda: float(bool(state.fail_closed.withdrawn)))
    gauges = ApiGauges(gpus=gpus, vms=Gauge("fabric_agent_vms", "VMs (replicas) the driver tracks", ["state"],
                                            registry=state.registry))
    if state.dataplane is not None and hasattr(state.dataplane, "flow_misses"):
        from agent.dataplane.metrics import DataplaneCollector

        state.registry.register(DataplaneCollector(state.dataplane))

    @app.middleware("http")
    async def _count(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        # The route template, never the raw path, so ids do not explode label cardinality.
        requests.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    return gauges
