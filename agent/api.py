"""The agent's HTTP API (served over mutual TLS by `fabric-agent serve`).

    GET    /v1/gpus                                  inventory (empty with a reason when no driver) and KVM's verdict
    POST   /v1/gpus/{bdf}/bind | /release            VFIO bind/release of a whole GPU and its group: 202, an operation
    GET    /v1/vms, POST /v1/vms                     list / create (idempotent by replica id): 202, an operation
    GET    /v1/vms/{id}, DELETE /v1/vms/{id}         status / delete: 202, an operation (it fails 404 when absent)
    GET    /v1/operations/{id}                       a long operation's state and result (agent/operations.py)
    GET    /v1/vms/{id}/logs?offset=&limit=         the engine log (lab/dry-run: its output; libvirt: the
                                              serial console), agent/vm/engine_log.py
    PUT    /v1/maglev/services/{vip}/{port}/{proto}  the whole backend set of one service
    GET    /v1/maglev/services[/{vip}/{port}/{proto}]
    DELETE /v1/maglev/services/{vip}/{port}/{proto}  404 when absent
    GET    /v1/bgp                                   VIPs announced and why, BGP sessions, events (FABRIC_BGP=1)
    POST   /v1/gpus/{bdf}/mig, DELETE /v1/gpus/{bdf}/mig/{gi}/{ci}   MIG instances (agent/mig_routes.py)
    POST   /v1/kv-index/match, GET /v1/kv-index, GET /v1/kv-index/tokenizer/{digest}
                                                     the replicas' KV blocks, models' tokenizers (agent/kv_index/routes.py)
    GET    /v1/health, GET /healthz (common.health's shape), GET /metrics

Who may call: TLS admits only certificates from the cluster CA (the server demands one), and
every node holds such a certificate, so the app also checks the certificate's common name
against ``allowed_client_cns`` (default ``fabricd``, the control plane's client certificate)
and its role (common.pki: ``fabricd``, or ``tool`` for an operator's extra CN): any other CN or role, a node's included, gets 403
``caller_not_allowed``. The CNs in ``kv_index_cns`` (default ``fabric-gateway``: the gateways'
client certificate, role ``gateway``) may call /v1/kv-index/* and nothing else. The app sees the certificate
only when served with ``common.peer_cert.PeerCertH11Protocol`` (``fabric-agent serve`` does);
an HTTPS request without it is refused rather than let through unchecked. Plain HTTP
(``--insecure``, loopback only) has no certificate to check. Handlers are sync on purpose: sysfs writes, libvirt and BPF map updates block,
and FastAPI runs sync handlers in its thread pool. Errors are FabricErrors rendered as
{"error": {"code", "message"}}.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent.mig_routes import mig_router
from agent.models import adapter_sets
from agent.operations import Operations
from agent.state import AgentState, as_dict, read_inventory, read_kvm
from agent.vm.base import VmSpec, VmStatus
from agent.vm.engine_log import MAX_CHUNK, read_chunk
from common import runtime_metrics
from common.agent_api import (
    AgentHealth,
    AgentOperation,
    GpuBindResult,
    GpuList,
    MaglevBackendStats,
    MaglevServiceList,
    MaglevServiceSpec,
    MaglevServiceView,
    VmCreateRequest,
    VmInfo,
    VmList,
    check_bdf,
    check_vm_id,
)
from common.errors import Conflict, FabricError, Forbidden, InvalidInput, NotFound, Refused
from common.health import healthz_body
from common.http_allow import allow_headers
from common.model_manifest import CheckFailed
from common.openapi_errors import add_error_responses
from common.peer_cert import CN_KEY, ROLE_KEY, scope_tls
from common.pki import ROLE_FABRICD, ROLE_GATEWAY, ROLE_TOOL

DEFAULT_ALLOWED_CLIENT_CNS = ("fabricd",)
DEFAULT_KV_INDEX_CNS = ("fabric-gateway",)  # read-only: the KV index and tokenizers (docs/kv-events.md)
KV_INDEX_PATH = "/v1/kv-index"


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


def _service_key(vip: str, port: int, proto: str) -> tuple[str, int, str]:
    try:
        ipaddress.IPv4Address(vip)
    except ValueError:
        raise InvalidInput(f"vip {vip!r} is not an IPv4 address") from None
    if not 1 <= port <= 65535:
        raise InvalidInput(f"port {port} is outside 1-65535")
    if proto not in ("tcp", "udp"):
        raise InvalidInput(f"proto {proto!r}: expected tcp or udp")
    return vip, port, proto


def _service_view(obj: Any, vip: str = "", port: int = 0, proto: str = "") -> MaglevServiceView:
    """A wire view from the dataplane's view: agent.dataplane.ServiceView (backends as a list of
    per-backend views with live counters) or a plain mapping {"backends": {addr: weight}}."""
    d = as_dict(obj)
    raw = d.get("backends", {})
    stats: list[MaglevBackendStats] = []
    if isinstance(raw, dict):
        backends = {str(k): int(v) for k, v in raw.items()}
        draining = sorted(str(b) for b in d.get("draining", ()))
    else:
        stats = [MaglevBackendStats.model_validate(as_dict(b)) for b in raw]
        backends = {b.address: b.weight for b in stats}
        draining = sorted(b.address for b in stats if b.draining)
    return MaglevServiceView(vip=str(d.get("vip", vip)), port=int(d.get("port", port)),
                             proto=d.get("proto", proto), backends=backends, draining=draining,
                             forwarding=d.get("forwarding", "nat"), stats=stats)


def _bind_result(bdf: str, result: Any, before: str, after: str) -> GpuBindResult:
    d = as_dict(result) if result is not None else {}
    return GpuBindResult(bdf=bdf, driver=None if after == "none" else after,
                         functions=[str(f) for f in d.get("functions", [bdf])],
                         changed=before != after, message=str(d.get("message", "")))


def caller_refusal(scope: Mapping[str, Any], allowed: Collection[str],
                   kv_index_cns: Collection[str] = ()) -> str | None:
    """Why this request's caller may not use the agent, or None when it may (a pure check).
    ``kv_index_cns`` may call the KV-index routes only."""
    if scope.get("scheme") not in ("https", "wss"):
        return None  # plain HTTP: `--insecure`, which binds loopback only
    tls = scope_tls(scope)
    if tls is None:
        return ("this agent cannot see client certificates, so it admits nobody over TLS: "
                "serve it with common.peer_cert.PeerCertH11Protocol (fabric-agent serve does)")
    cn = tls.get(CN_KEY)
    who = ", ".join(sorted(allowed)) or "nobody"
    if cn is None:
        return f"a client certificate is required; only the control plane ({who}) may call this agent"
    path = scope.get("path", "")
    role = tls.get(ROLE_KEY)
    if (cn in kv_index_cns and role == ROLE_GATEWAY
            and (path == KV_INDEX_PATH or path.startswith(KV_INDEX_PATH + "/"))):
        return None
    if cn not in allowed or role not in (ROLE_FABRICD, ROLE_TOOL):
        return (f"certificate CN {cn!r} (role {role or 'none'}) may not call this agent; only the control "
                f"plane ({who}, role fabricd or tool) may (fabric-agent serve --allowed-client-cn)")
    return None


def create_app(state: AgentState, *, allowed_client_cns: Collection[str] = DEFAULT_ALLOWED_CLIENT_CNS,
               kv_index_cns: Collection[str] = DEFAULT_KV_INDEX_CNS) -> FastAPI:
    runtime = runtime_metrics.install(state.registry)
    app = FastAPI(title="fabric-agent", docs_url=None, redoc_url=None, lifespan=runtime_metrics.lifespan(runtime))
    app.state.agent = state
    operations = Operations()
    app.state.operations = operations
    allowed = frozenset(allowed_client_cns)
    kv_readers = frozenset(kv_index_cns)
    requests = Counter("fabric_agent_requests", "Agent API requests", ["route", "code"],
                       registry=state.registry)
    gpu_gauge = Gauge("fabric_agent_gpus", "GPUs in the inventory", registry=state.registry)
    if state.fail_closed is not None:
        Gauge("fabric_agent_fail_closed", "1 while the Maglev services are withdrawn: a fail-closed site's link "
              "to fabricd is down (agent.fail_closed)", registry=state.registry).set_function(
            lambda: float(bool(state.fail_closed.withdrawn)))
    vm_gauge = Gauge("fabric_agent_vms", "VMs (replicas) the driver tracks", ["state"],
                     registry=state.registry)
    if state.dataplane is not None and hasattr(state.dataplane, "flow_misses"):
        from agent.dataplane.metrics import DataplaneCollector

        state.registry.register(DataplaneCollector(state.dataplane))

    # Registered before _count so that _count (the outer one) also counts refused callers.
    @app.middleware("http")
    async def _only_the_control_plane(request: Request, call_next):
        refusal = caller_refusal(request.scope, allowed, kv_readers)
        if refusal is not None:
            return JSONResponse(Forbidden(refusal, code="caller_not_allowed").to_body(), status_code=403)
        return await call_next(request)

    @app.middleware("http")
    async def _count(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        # The route template, never the raw path, so ids do not explode label cardinality.
        requests.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    @app.exception_handler(FabricError)
    async def _fabric_error(_req: Request, exc: FabricError):
        return JSONResponse(exc.to_body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # Starlette's own answers (a body that is not JSON, an unknown route, a wrong method) in
        # the one error shape, not {"detail": ...}: found by the schemathesis fuzz.
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = allow_headers(request, headers)
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError):
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return JSONResponse(InvalidInput("; ".join(parts) or "invalid request").to_body(), status_code=422)

    # GPUs ---------------------------------------------------------------------------------
    @app.get("/v1/gpus", response_model=GpuList)
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

    @app.post("/v1/gpus/{bdf}/bind", response_model=AgentOperation, status_code=202)
    def bind_gpu(bdf: str) -> AgentOperation:
        return _gpu_op(bdf, "bind")

    @app.post("/v1/gpus/{bdf}/release", response_model=AgentOperation, status_code=202)
    def release_gpu(bdf: str) -> AgentOperation:
        return _gpu_op(bdf, "release")

    @app.get("/v1/operations/{op_id}", response_model=AgentOperation)
    def get_operation(op_id: str) -> AgentOperation:
        op = operations.get(op_id)
        if op is None:
            raise NotFound(f"no operation {op_id} on node {state.node_id} (finished long ago, or the agent restarted)")
        return op

    # VMs ----------------------------------------------------------------------------------
    @app.get("/v1/vms", response_model=VmList)
    def list_vms() -> VmList:
        vms = [_vm_info(s) for s in state.vm_driver.list()]
        vm_gauge.clear()
        for v in vms:
            vm_gauge.labels(v.state).inc()
        return VmList(vms=vms)

    @app.post("/v1/vms", response_model=AgentOperation, status_code=202)
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
                return {"vm": _vm_info(state.vm_driver.create(spec))}

        return operations.start("vm-create", req.replica_id, work)

    def _vm_id(vm_id: str) -> str:
        try:
            return check_vm_id(vm_id)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None

    @app.get("/v1/vms/{vm_id}", response_model=VmInfo)
    def get_vm(vm_id: str) -> VmInfo:
        status = state.vm_driver.get(_vm_id(vm_id))
        if status is None or status.state == "absent":
            raise NotFound(f"vm {vm_id} does not exist on node {state.node_id}")
        return _vm_info(status)

    @app.get("/v1/vms/{vm_id}/logs")
    def vm_logs(vm_id: str, offset: int = Query(-65536), limit: int = Query(65536, ge=1, le=MAX_CHUNK)) -> dict:
        vm_id = _vm_id(vm_id)
        log_path = getattr(state.vm_driver, "log_path", None)
        if log_path is None:
            raise Refused(f"the {state.vm_driver.name} driver on node {state.node_id} keeps no engine log")
        path = log_path(vm_id)
        if path is None or not path.exists():
            raise NotFound(f"no engine log for vm {vm_id} on node {state.node_id}")
        return asdict(read_chunk(path, offset, limit))

    @app.delete("/v1/vms/{vm_id}", response_model=AgentOperation, status_code=202)
    def delete_vm(vm_id: str) -> AgentOperation:
        vm_id = _vm_id(vm_id)

        def work() -> dict:
            with state.lock:
                if not state.vm_driver.delete(vm_id):
                    raise NotFound(f"vm {vm_id} does not exist on node {state.node_id}")
            return {}

        return operations.start("vm-delete", vm_id, work)

    # Maglev -------------------------------------------------------------------------------
    def _dataplane():
        if state.dataplane is None:
            raise Refused(f"the dataplane is not loaded on node {state.node_id}: "
                          f"{state.dataplane_message or 'started with --no-dataplane'}")
        return state.dataplane

    @app.get("/v1/maglev/services", response_model=MaglevServiceList)
    def list_services() -> MaglevServiceList:
        return MaglevServiceList(services=[_service_view(s) for s in _dataplane().list_services()])

    @app.put("/v1/maglev/services/{vip}/{port}/{proto}", response_model=MaglevServiceView)
    def put_service(vip: str, port: int, proto: str, spec: MaglevServiceSpec) -> MaglevServiceView:
        vip, port, proto = _service_key(vip, port, proto)
        unknown = sorted(set(spec.draining) - set(spec.backends))
        if unknown:
            raise InvalidInput(f"draining names backends not in the set: {', '.join(unknown)}")
        dp = _dataplane()
        if state.fail_closed is not None:
            state.fail_closed.admit_put()  # 503 fail_closed while a fail-closed site is cut off
        changed = dp.put_service(vip, port, proto, dict(spec.backends), draining=tuple(spec.draining),
                                 forwarding=spec.forwarding)
        if changed and state.bgp is not None:
            state.bgp.poke()  # announce or withdraw the VIP now, not at the next pass
        written = dp.get_service(vip, port, proto)  # read back: what the maps now hold
        if written is not None:
            return _service_view(written, vip, port, proto)
        return MaglevServiceView(vip=vip, port=port, proto=proto, backends=spec.backends,
                                 draining=sorted(spec.draining))

    @app.get("/v1/maglev/services/{vip}/{port}/{proto}", response_model=MaglevServiceView)
    def get_service(vip: str, port: int, proto: str) -> MaglevServiceView:
        vip, port, proto = _service_key(vip, port, proto)
        view = _dataplane().get_service(vip, port, proto)
        if view is None:
            raise NotFound(f"service {vip}:{port}/{proto} is not in the dataplane")
        return _service_view(view, vip, port, proto)

    @app.delete("/v1/maglev/services/{vip}/{port}/{proto}", status_code=204)
    def delete_service(vip: str, port: int, proto: str) -> Response:
        vip, port, proto = _service_key(vip, port, proto)
        if not _dataplane().delete_service(vip, port, proto):
            raise NotFound(f"service {vip}:{port}/{proto} is not in the dataplane")
        if state.bgp is not None:
            state.bgp.poke()
        return Response(status_code=204)

    @app.get("/v1/bgp")
    def bgp_status() -> dict:
        """What this node announces and why, its BGP sessions, and recent events."""
        if state.bgp is None:
            raise NotFound(f"BGP is off on node {state.node_id} (FABRIC_BGP=1 turns it on)")
        return state.bgp.status()

    if state.models is not None:
        from agent.models.routes import add_model_routes

        add_model_routes(app, state.models, state.node_id, state.registry)

    # health and metrics ---------------------------------------------------------------------
    @app.get("/v1/health", response_model=AgentHealth)
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

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        """Liveness in the shape every Fabric process shares (common.health)."""
        status, body = healthz_body("fabric-agent", {
            "vm_driver": f"ok: {state.vm_driver.name}",
            "dataplane": "ok: loaded" if state.dataplane is not None else f"off: {state.dataplane_message or 'not loaded'}",
        })
        return JSONResponse(body, status_code=status)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        refresh = getattr(app.state, "refresh_model_metrics", None)
        if refresh is not None:
            refresh()
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(mig_router(is_enabled=lambda: state.settings.pci_mig))  # FABRIC_PCI_MIG
    if state.kv_index is not None:  # /v1/kv-index/match, /v1/kv-index, /v1/kv-index/tokenizer (agent/kv_index/routes.py)
        from agent.kv_index.routes import kv_index_router
        from agent.kv_index.service import runs_simulators

        models = state.models
        app.include_router(kv_index_router(
            state.kv_index.subscriber, model_dir=models.cache.any_path_for if models is not None else None,
            manifest=models.cache.manifest_text if models is not None else None,
            simulated=runs_simulators(state.vm_driver), blind_after_s=state.kv_index.blind_after_s))
    _document_errors(app)
    return app


AGENT_ERRORS = {"400": "a malformed request", "403": "the caller's certificate "
                "may not call this agent (only the control plane's)", "404": "no such GPU, VM or service",
                "409": "conflict with the node's current state", "422": "invalid input; the message names "
                "each field", "503": "the driver or dataplane is not available here"}


def _document_errors(app: FastAPI) -> None:
    """Every operation of the agent's OpenAPI lists the errors it can answer, in the one shape."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            add_error_responses(build(), AGENT_ERRORS)
        return app.openapi_schema

    app.openapi = openapi
