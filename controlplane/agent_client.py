"""The control plane's client of one agent's API (async httpx over mutual TLS).

Errors carry their meaning so controllers can decide retries:
  - unreachable agent, timeouts, 5xx    -> common.errors.TransientError (retry with backoff)
  - agent 4xx with an error body        -> the FabricError of that status, the agent's message kept
  - delete_vm / delete_service on 404   -> False (already gone); get_vm / get_service on 404 -> None
Long operations (GPU bind and release, VM create and delete) are started on the agent, which
answers 202 with an operation (agent/operations.py), and then polled with
GET /v1/operations/{id}: every request keeps the short client timeout, and the wait as a whole
has a deadline sized for the work (OPERATION_DEADLINE_S). A failed operation raises what the
synchronous call would have; a deadline passed raises TransientError, and the next call joins
the operation still running (one per kind and target on the agent), never starting it twice.
``AgentClients(state_dir)`` hands out one client per node address, authenticated with fabricd's
own certificate from the cluster CA ({state_dir}/pki/fabricd.crt, which is client+server).
A node's client is pinned to that node: the TLS handshake names the node id (SNI) and checks the
agent's certificate against it, not against the address the node reported, so an address that
leads to another node's agent (whose certificate names that other node) fails to connect.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import httpx

from common.agent_api import (
    AgentHealth,
    AgentOperation,
    GpuBindResult,
    GpuList,
    MaglevBatchResult,
    MaglevServiceBatch,
    MaglevServiceList,
    MaglevServicePut,
    MaglevServiceView,
    VmCreateRequest,
    VmInfo,
    VmList,
)
from common.errors import FabricError, Refused, TransientError, error_for_status
from common.model_api import AgentJobRequest, AgentJobView, CacheList, VerifyRequest, VerifyResult
from common.pki import client_ssl_context, pki_dir
from common.schemas import Node

DEFAULT_TIMEOUT_S = 10.0  # each request; long operations are polled (OPERATION_DEADLINE_S)
# How long fabricd waits for each kind of long operation: a VFIO bind of a GPU whose driver is
# slow to let go, QEMU pinning a guest's memory (about a minute per 100 GiB), a guest that
# takes its shutdown timeout to stop. Passed, the next reconcile pass joins the same operation.
OPERATION_DEADLINE_S = {"gpu-bind": 300.0, "gpu-release": 300.0, "vm-create": 1200.0, "vm-delete": 600.0}
POLL_S = (0.2, 2.0)  # the first pause between polls, doubling up to the second
CLIENT_CERT_NAME = "fabricd"
VERIFY_TIMEOUT_S = 1800.0


def error_from_response(resp: httpx.Response, what: str) -> FabricError:
    """The FabricError matching an agent's error response, keeping its code and message."""
    code, message = None, f"agent answered {resp.status_code} to {what}"
    try:
        body = resp.json()
        err = body.get("error", {}) if isinstance(body, dict) else {}
        code = err.get("code") or None
        message = f"agent: {err.get('message') or message}"
    except ValueError:
        pass
    return error_for_status(resp.status_code)(message, code=code)


class AgentClient:
    def __init__(self, base_url: str, *, verify: ssl.SSLContext | bool = True,
                 timeout: float = DEFAULT_TIMEOUT_S, transport: httpx.AsyncBaseTransport | None = None,
                 node_id: str | None = None, poll_s: tuple[float, float] = POLL_S,
                 deadlines: dict[str, float] | None = None):
        self.base_url = base_url.rstrip("/")
        self.poll_s = poll_s
        self.deadlines = {**OPERATION_DEADLINE_S, **(deadlines or {})}
        self._http = httpx.AsyncClient(base_url=self.base_url, verify=verify, timeout=timeout,
                                       transport=transport)
        # https: the agent's certificate must name this node (checked as the TLS server name).
        self._extensions = {"sni_hostname": node_id} if node_id and self.base_url.startswith("https://") else {}

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, *, json: Any = None,
                    missing_ok: bool = False, timeout: float | None = None) -> httpx.Response | None:
        what = f"{method} {path}"
        try:
            resp = await self._http.request(method, path, json=json, extensions=self._extensions,
                                            timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
        except httpx.TimeoutException as exc:
            raise TransientError(f"agent {self.base_url} timed out on {what}") from exc
        except httpx.TransportError as exc:
            # Includes refused connections and TLS failures (e.g. the agent rejects our cert).
            raise TransientError(f"agent {self.base_url} unreachable for {what}: {type(exc).__name__}") from exc
        if resp.status_code == 404 and missing_ok:
            return None
        if resp.status_code >= 400:
            raise error_from_response(resp, what)
        return resp

    async def _operation(self, method: str, path: str, *, json: Any = None,
                         missing_ok: bool = False) -> AgentOperation | None:
        """Start a long operation and wait for it (module docstring). None: it failed 404 and
        ``missing_ok``."""
        op = AgentOperation.model_validate((await self._call(method, path, json=json)).json())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadlines[op.kind]
        pause, most = self.poll_s
        while op.state == "running":
            if loop.time() >= deadline:
                raise TransientError(f"agent {self.base_url}: {op.kind} of {op.target} is still running after "
                                     f"{self.deadlines[op.kind]:g}s (operation {op.id}); waiting for it again")
            await asyncio.sleep(pause)
            pause = min(pause * 2, most)
            resp = await self._call("GET", f"/v1/operations/{op.id}", missing_ok=True)
            if resp is None:  # the agent restarted: its operations went with it
                raise TransientError(f"agent {self.base_url} no longer knows operation {op.id} ({op.kind} of "
                                     f"{op.target}); it is started again")
            op = AgentOperation.model_validate(resp.json())
        if op.error is not None:
            if op.error.status == 404 and missing_ok:
                return None
            raise error_for_status(op.error.status)(f"agent: {op.error.message}", code=op.error.code)
        return op

    # GPUs
    async def list_gpus(self) -> GpuList:
        return GpuList.model_validate((await self._call("GET", "/v1/gpus")).json())

    async def bind_gpu(self, bdf: str) -> GpuBindResult:
        return _result((await self._operation("POST", f"/v1/gpus/{bdf}/bind")), "gpu")

    async def release_gpu(self, bdf: str) -> GpuBindResult:
        return _result((await self._operation("POST", f"/v1/gpus/{bdf}/release")), "gpu")

    # MIG instances (the agent refuses unless it runs with FABRIC_PCI_MIG=1)
    async def create_mig(self, bdf: str, profile: str) -> dict:
        return (await self._call("POST", f"/v1/gpus/{bdf}/mig", json={"profile": profile})).json()

    async def destroy_mig(self, bdf: str, gpu_instance_id: int, compute_instance_id: int) -> None:
        await self._call("DELETE", f"/v1/gpus/{bdf}/mig/{gpu_instance_id}/{compute_instance_id}", missing_ok=True)

    # VMs
    async def create_vm(self, req: VmCreateRequest) -> VmInfo:
        return _result(await self._operation("POST", "/v1/vms", json=req.model_dump(mode="json")), "vm")

    async def get_vm(self, vm_id: str) -> VmInfo | None:
        resp = await self._call("GET", f"/v1/vms/{vm_id}", missing_ok=True)
        return None if resp is None else VmInfo.model_validate(resp.json())

    async def list_vms(self) -> list[VmInfo]:
        return VmList.model_validate((await self._call("GET", "/v1/vms")).json()).vms

    async def vm_logs(self, vm_id: str, offset: int, limit: int) -> dict:
        """A chunk of the VM's engine log: {text, offset, next_offset, size} (agent/vm/engine_log.py)."""
        return (await self._call("GET", f"/v1/vms/{vm_id}/logs?offset={offset}&limit={limit}")).json()

    async def delete_vm(self, vm_id: str) -> bool:
        return await self._operation("DELETE", f"/v1/vms/{vm_id}", missing_ok=True) is not None

    # Maglev
    async def put_services(self, services: list[MaglevServicePut], timeout: float | None = None) -> MaglevBatchResult:
        """Every service whose generation moved, in one request (the routing controller's push)."""
        resp = await self._call("PUT", "/v1/maglev/services", timeout=timeout,
                                json=MaglevServiceBatch(services=services).model_dump(mode="json"))
        return MaglevBatchResult.model_validate(resp.json())

    async def get_service(self, vip: str, port: int, proto: str) -> MaglevServiceView | None:
        resp = await self._call("GET", f"/v1/maglev/services/{vip}/{port}/{proto}", missing_ok=True)
        return None if resp is None else MaglevServiceView.model_validate(resp.json())

    async def list_services(self) -> list[MaglevServiceView]:
        return MaglevServiceList.model_validate((await self._call("GET", "/v1/maglev/services")).json()).services

    async def delete_service(self, vip: str, port: int, proto: str) -> bool:
        path = f"/v1/maglev/services/{vip}/{port}/{proto}"
        return await self._call("DELETE", path, missing_ok=True) is not None

    # Models
    async def submit_model_job(self, req: AgentJobRequest) -> AgentJobView:
        resp = await self._call("POST", "/v1/models/jobs", json=req.model_dump(mode="json"))
        return AgentJobView.model_validate(resp.json())

    async def model_cache(self) -> CacheList:
        return CacheList.model_validate((await self._call("GET", "/v1/models/cache")).json())

    async def evict_model(self, digest: str) -> bool:
        return await self._call("DELETE", f"/v1/models/cache/{digest}", missing_ok=True) is not None

    async def verify_model(self, req: VerifyRequest) -> VerifyResult:
        # Hashing a large model takes minutes: wait for it (VERIFY_TIMEOUT_S), not the default.
        resp = await self._call("POST", "/v1/models/verify", json=req.model_dump(mode="json"),
                                timeout=VERIFY_TIMEOUT_S)
        return VerifyResult.model_validate(resp.json())

    async def health(self) -> AgentHealth:
        return AgentHealth.model_validate((await self._call("GET", "/v1/health")).json())


def _result(op: AgentOperation | None, field: str) -> Any:
    value = None if op is None else getattr(op, field)
    if value is None:
        raise TransientError(f"agent answered operation {op.id if op else '?'} without its {field} result")
    return value


class AgentClients:
    """One AgentClient per agent address, sharing fabricd's TLS identity.

    ``insecure=True`` is for the all-in-one lab, where agents serve plain HTTP on loopback; an
    https:// node address still gets TLS.
    """

    def __init__(self, state_dir: str | Path, *, insecure: bool = False, timeout: float = DEFAULT_TIMEOUT_S,
                 cert_name: str = CLIENT_CERT_NAME):
        self.state_dir = Path(state_dir)
        self.insecure = insecure
        self.timeout = timeout
        self.cert_name = cert_name
        self._ssl: ssl.SSLContext | None = None
        self._clients: dict[str, AgentClient] = {}

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            d = pki_dir(self.state_dir)
            crt, key = d / f"{self.cert_name}.crt", d / f"{self.cert_name}.key"
            if not (crt.exists() and key.exists()):
                raise Refused(f"no client certificate {crt}; run `fabricd init` to make it")
            self._ssl = client_ssl_context(d / "ca.crt", crt, key)
        return self._ssl

    def for_node(self, node: Node) -> AgentClient:
        """The node's agent, pinned to its id (its certificate must name it)."""
        return self.for_address(node.address, node_id=node.id)

    def for_address(self, address: str, node_id: str | None = None) -> AgentClient:
        address = address.rstrip("/")
        client = self._clients.get(f"{node_id}@{address}")
        if client is None:
            if address.startswith("https://"):
                verify: ssl.SSLContext | bool = self.ssl_context()
            elif self.insecure:
                verify = False
            else:
                raise Refused(f"agent address {address} is not https:// and fabricd is not in insecure mode")
            client = AgentClient(address, verify=verify, timeout=self.timeout, node_id=node_id)
            self._clients[f"{node_id}@{address}"] = client
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
