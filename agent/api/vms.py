"""VM (replica) routes: the driver's VMs, created idempotently by replica id, and their engine logs.

    GET    /v1/vms, POST /v1/vms                     list / create (idempotent by replica id): 202, an operation
    GET    /v1/vms/{id}, DELETE /v1/vms/{id}         status / delete: 202, an operation (it fails 404 when absent)
    GET    /v1/vms/{id}/logs?offset=&limit=         the engine log (lab/dry-run: its output; libvirt: the
                                              serial console), agent/vm/engine_log.py
"""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Query
from prometheus_client import Gauge

from agent.models import adapter_sets
from agent.operations import Operations
from agent.state import AgentState, read_inventory
from agent.vm.base import VmSpec, VmStatus
from agent.vm.engine_log import MAX_CHUNK, read_chunk
from common.agent_api import AgentOperation, VmCreateRequest, VmInfo, VmList, check_vm_id
from common.errors import Conflict, InvalidInput, NotFound, Refused
from common.model_manifest import CheckFailed


def _vm_info(status: VmStatus) -> VmInfo:
    return VmInfo(id=status.id, state=status.state, host=status.host, port=status.port,
                  message=status.message)


def _spec(req: VmCreateRequest, model_dir: str | None = None, adapters: tuple | None = None) -> VmSpec:
    adapters_dir, max_rank = adapters or (None, None)
    return VmSpec(
        replica_id=req.replica_id, deployment=req.deployment, model_name=req.model_name,
        model_source=req.model_source, runtime=req.runtime, gpus=tuple(req.gpus),
        gpu_memory_mib=req.gpu_memory_mib, cpu=req.cpu, memory_gib=req.memory_gib, port=req.port,
        max_model_len=req.max_model_len, extra_args=tuple(req.extra_args),
        engine_args=dict(req.engine_args), model_dir=model_dir, dsr_vips=tuple(req.dsr_vips),
        adapters_dir=adapters_dir, max_loras=(req.max_loras or len(req.adapter_digests)) if adapters_dir else None,
        max_lora_rank=max_rank,
    )


def _adapter_set(state: AgentState, req: VmCreateRequest) -> tuple[str, int | None] | None:
    """What the replica sees at /adapters and the LoRA rank vLLM must accept (agent.models.adapter_sets);
    None without adapters, or for a runtime with no runtime LoRA API (only vLLM has one)."""
    if not req.adapter_digests or req.runtime != "vllm":
        return None
    if state.models is None:
        raise Conflict(f"node {state.node_id} has no model cache to hold adapters", code="model_not_ready")
    return adapter_sets.for_vm(state.models.cache, req.adapter_digests, state.models.settings.max_files,
                               req.model_tenant)


def _vm_id(vm_id: str) -> str:
    try:
        return check_vm_id(vm_id)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def vms_router(state: AgentState, operations: Operations, vm_gauge: Gauge) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/vms", response_model=VmList)
    def list_vms() -> VmList:
        vms = [_vm_info(s) for s in state.vm_driver.list()]
        vm_gauge.clear()
        for v in vms:
            vm_gauge.labels(v.state).inc()
        return VmList(vms=vms)

    @router.post("/v1/vms", response_model=AgentOperation, status_code=202)
    def create_vm(req: VmCreateRequest) -> AgentOperation:
        if req.mig_slices and state.vm_driver.name not in ("lab", "dry-run"):
            # A MIG instance cannot be passed through VFIO to a VM (that needs NVIDIA vGPU).
            raise Refused(f"the {state.vm_driver.name} driver cannot give a VM a MIG slice "
                          f"({', '.join(req.mig_slices)}); slices serve lab and dry-run replicas only")
        if req.gpus and state.binder is not None:
            known = {g.pci for g in read_inventory(state.inventory).gpus}
            missing = [b for b in req.gpus if b not in known]
            if missing:
                raise Refused(f"GPUs {', '.join(missing)} are not in this node's inventory")
        model_dir = None
        if req.model_digest is not None:
            try:  # a tenant's local source is hashed again: its tenant may have edited it since
                path = (state.models.cache.ready_path(req.model_digest, req.model_tenant, state.models.settings.max_files)
                        if state.models is not None else None)
            except CheckFailed as exc:
                raise Conflict(exc.message, code="model_changed") from None
            if path is None:
                raise Conflict(f"model digest {req.model_digest} is not ready on node {state.node_id}; "
                               "materialize the model first", code="model_not_ready")
            state.models.cache.touch(req.model_digest)
            model_dir = str(path)
        spec = _spec(req, model_dir, _adapter_set(state, req))

        def work() -> dict:
            with state.lock:
                if state.engines is not None:  # its deployment and runtime, for the reports (agent.engine_watch)
                    state.engines.book.note(req)
                return {"vm": _vm_info(state.vm_driver.create(spec))}

        return operations.start("vm-create", req.replica_id, work)

    @router.get("/v1/vms/{vm_id}", response_model=VmInfo)
    def get_vm(vm_id: str) -> VmInfo:
        status = state.vm_driver.get(_vm_id(vm_id))
        if status is None or status.state == "absent":
            raise NotFound(f"vm {vm_id} does not exist on node {state.node_id}")
        return _vm_info(status)

    @router.get("/v1/vms/{vm_id}/logs")
    def vm_logs(vm_id: str, offset: int = Query(-65536), limit: int = Query(65536, ge=1, le=MAX_CHUNK)) -> dict:
        vm_id = _vm_id(vm_id)
        log_path = getattr(state.vm_driver, "log_path", None)
        if log_path is None:
            raise Refused(f"the {state.vm_driver.name} driver on node {state.node_id} keeps no engine log")
        path = log_path(vm_id)
        if path is None or not path.exists():
            raise NotFound(f"no engine log for vm {vm_id} on node {state.node_id}")
        return asdict(read_chunk(path, offset, limit))

    @router.delete("/v1/vms/{vm_id}", response_model=AgentOperation, status_code=202)
    def delete_vm(vm_id: str) -> AgentOperation:
        vm_id = _vm_id(vm_id)

        def work() -> dict:
            with state.lock:
                gone = state.vm_driver.delete(vm_id)
                if state.engines is not None:
                    state.engines.book.forget(vm_id)
                if not gone:
                    raise NotFound(f"vm {vm_id} does not exist on node {state.node_id}")
            return {}

        return operations.start("vm-delete", vm_id, work)

    return router
