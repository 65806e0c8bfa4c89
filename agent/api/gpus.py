"""GPU routes: the inventory with KVM's verdict, and VFIO bind/release of a whole GPU and its group.

    GET    /v1/gpus                          inventory (empty with a reason when no driver) and KVM's verdict
    POST   /v1/gpus/{bdf}/bind | /release    202, an operation (agent/operations.py)
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from prometheus_client import Gauge

from agent.operations import Operations
from agent.state import AgentState, as_dict, read_inventory, read_kvm
from common.agent_api import AgentOperation, GpuBindResult, GpuList, check_bdf
from common.errors import InvalidInput, NotFound


def _bind_result(bdf: str, result: Any, before: str, after: str) -> GpuBindResult:
    d = as_dict(result) if result is not None else {}
    return GpuBindResult(bdf=bdf, driver=None if after == "none" else after,
                         functions=[str(f) for f in d.get("functions", [bdf])],
                         changed=before != after, message=str(d.get("message", "")))


def gpus_router(state: AgentState, operations: Operations, gpu_gauge: Gauge) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/gpus", response_model=GpuList)
    def list_gpus() -> GpuList:
        inv = read_inventory(state.inventory)
        gpu_gauge.set(len(inv.gpus))
        return GpuList(gpus=inv.gpus, message=inv.message, kvm=read_kvm(state.kvm))

    def _checked_bdf(bdf: str) -> str:
        try:
            return check_bdf(bdf)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    def _known_gpu(bdf: str) -> None:
        known = {g.pci for g in read_inventory(state.inventory).gpus}
        if bdf not in known:
            raise NotFound(f"GPU {bdf} is not in this node's inventory")

    def _gpu_op(bdf: str, op: str) -> AgentOperation:
        bdf = _checked_bdf(bdf)
        _known_gpu(bdf)
        binder = state.binder

        def work() -> dict:
            if binder is None:
                return {"gpu": GpuBindResult(bdf=bdf, driver=None, changed=False,
                                             message=f"the {state.vm_driver.name} driver does not bind GPUs")}
            with state.lock:
                before = binder.status(bdf)
                result = getattr(binder, op)(bdf)
                return {"gpu": _bind_result(bdf, result, before, binder.status(bdf))}

        return operations.start("gpu-bind" if op == "bind" else "gpu-release", bdf, work)

    @router.post("/v1/gpus/{bdf}/bind", response_model=AgentOperation, status_code=202)
    def bind_gpu(bdf: str) -> AgentOperation:
        return _gpu_op(bdf, "bind")

    @router.post("/v1/gpus/{bdf}/release", response_model=AgentOperation, status_code=202)
    def release_gpu(bdf: str) -> AgentOperation:
        return _gpu_op(bdf, "release")

    return router
