"""Wire models of the agent API and of node registration, shared by the agent and fabricd.

The agent serves these over mutual TLS (agent/api/); the control plane's client
(controlplane/agent_client.py) parses them back. Node registration and heartbeat bodies
(NodeReport) travel the other way, from the agent to fabricd (controlplane/api/nodes.py).
Validation messages name the field that is wrong; both sides turn them into 422 bodies.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.model_api import check_adapter_name, check_digest
from common.schemas import Forwarding, GpuInfo, KvmStatus, ReplicaObservation, check_name

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# Replica ids become file names (dry-run pid files) and libvirt domain names: keep them plain.
VM_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,126}$")
# Engine knobs become command-line flags of the engine (no shell); keep their names plain.
ENGINE_ARG = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")

Proto = Literal["tcp", "udp"]
VmStateName = Literal["running", "starting", "stopped", "failed", "absent"]


def check_bdf(value: str) -> str:
    if not isinstance(value, str) or not BDF.match(value):
        raise ValueError(f"PCI address {value!r} is not in the sysfs form 0000:bb:dd.f (lowercase hex)")
    return value


def check_vm_id(value: str) -> str:
    if not isinstance(value, str) or not VM_ID.match(value):
        raise ValueError(
            f"vm id {value!r}: expected 1-127 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def check_backend(value: str) -> str:
    host, sep, port = value.rpartition(":")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"backend {value!r}: expected IPv4:PORT") from None
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"backend {value!r}: port must be 1-65535")
    return value


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuList(WireModel):
    gpus: list[GpuInfo] = Field(default_factory=list)
    message: str = Field("", description="why the inventory is empty or partial (no driver, ...)")
    kvm: KvmStatus | None = Field(None, description="whether KVM runs guests here; None: not probed (not libvirt)")


class GpuBindResult(WireModel):
    bdf: str
    driver: str | None = Field(None, description="driver bound after the call (vfio-pci after bind)")
    functions: list[str] = Field(default_factory=list, description="every function moved with it")
    changed: bool = True
    message: str = ""


class VmCreateRequest(WireModel):
    """Mirrors agent.vm.base.VmSpec; the agent turns it into one."""

    replica_id: str
    deployment: str
    model_name: str = Field(..., min_length=1, max_length=256)
    model_source: str = Field(..., min_length=1, max_length=1024)
    runtime: str = "vllm"
    gpus: list[str] = Field(default_factory=list, max_length=8)
    mig_slices: list[str] = Field(default_factory=list, max_length=1,
                                  description="a MIG slice id (PARENT--PROFILE--N) the replica runs on")
    gpu_memory_mib: int = Field(0, ge=0)
    cpu: int = Field(1, ge=1, le=512)
    memory_gib: float = Field(1, gt=0, le=8192)
    port: int = Field(8000, ge=1, le=65535)
    max_model_len: int | None = Field(None, gt=0)
    extra_args: list[str] = Field(default_factory=list)
    engine_args: dict[str, str] = Field(default_factory=dict)
    model_digest: str | None = Field(None, description="the verified model directory the guest mounts at /models")
    model_tenant: str | None = Field(None, description="the model's tenant: only its own local sources (hashed "
                                     "again before the VM starts) or the agent's cached copies serve it")
    adapter_digests: dict[str, str] = Field(default_factory=dict, max_length=256,
                                            description="LoRA adapter name -> its verified digest on the node; "
                                                        "the guest sees them at /adapters/{name}")
    max_loras: int | None = Field(None, ge=1, le=256, description="adapters loaded at once (vLLM --max-loras)")
    dsr_vips: list[str] = Field(default_factory=list, max_length=32,
                                description="VIPs of dsr-ipip services this replica answers for: the guest "
                                            "decapsulates IPIP and holds them on loopback (docs/dataplane.md)")

    @field_validator("dsr_vips")
    @classmethod
    def _dsr_vips(cls, v: list[str]) -> list[str]:
        for vip in v:
            try:
                ipaddress.IPv4Address(vip)
            except ValueError:
                raise ValueError(f"dsr_vips: {vip!r} is not an IPv4 address") from None
        return v

    @field_validator("adapter_digests")
    @classmethod
    def _adapter_digests(cls, v: dict[str, str]) -> dict[str, str]:
        for name, digest in v.items():
            check_adapter_name(name)
            check_digest(digest)
        return v

    @field_validator("model_digest")
    @classmethod
    def _model_digest(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[0-9a-f]{64}$", v):
            raise ValueError(f"model_digest {v!r}: expected 64 lowercase hex characters")
        return v

    @field_validator("replica_id")
    @classmethod
    def _replica(cls, v: str) -> str:
        return check_vm_id(v)

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        return check_name(v, "deployment")

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[str]) -> list[str]:
        return [check_bdf(b) for b in v]

    @field_validator("mig_slices")
    @classmethod
    def _slices(cls, v: list[str]) -> list[str]:
        for s in v:
            parent, _, rest = s.partition("--")
            check_bdf(parent)
            if not re.match(r"^[1-7]g\.[0-9]+gb--[0-9]$", rest):
                raise ValueError(f"mig slice {s!r}: expected PARENT--PROFILE--N")
        return v

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENGINE_ARG.match(key):
                raise ValueError(f"engine_args key {key!r}: expected lowercase letters, digits, '_' or '-'")
            if str(value).startswith("-"):
                raise ValueError(f"engine_args[{key!r}]: a value may not start with '-'")
        return v


class VmInfo(WireModel):
    id: str
    state: VmStateName
    host: str | None = None
    port: int = 8000
    message: str = ""


class VmList(WireModel):
    vms: list[VmInfo] = Field(default_factory=list)


OperationKind = Literal["gpu-bind", "gpu-release", "vm-create", "vm-delete"]


class OperationError(WireModel):
    status: int = Field(..., description="the HTTP status the synchronous call would have answered")
    code: str | None = None
    message: str


class AgentOperation(WireModel):
    """One long agent operation (agent/operations.py): answered 202 by the verb that starts it,
    then read with GET /v1/operations/{id} until it is no longer running."""

    id: str
    kind: OperationKind
    target: str = Field(..., description="the GPU's BDF or the replica id: one running operation per kind and target")
    state: Literal["running", "succeeded", "failed"] = "running"
    started_at: float
    finished_at: float | None = None
    gpu: GpuBindResult | None = Field(None, description="gpu-bind / gpu-release result")
    vm: VmInfo | None = Field(None, description="vm-create result")
    error: OperationError | None = None


def service_key(vip: str, port: int, proto: str) -> str:
    """How a service is named where its generation is reported: ``VIP:PORT/PROTO``."""
    return f"{vip}:{port}/{proto}"


class MaglevServiceSpec(WireModel):
    """PUT body: the whole backend set of one VIP:port:proto with weights 0-32, and the generation
    of the routing plan it comes from (common.records.plans): an agent refuses a generation older
    than the one it holds for that service (409 ``stale_generation``), so a late PUT never
    overwrites a newer one. 0 is a hand-written service with no plan behind it."""

    generation: int = Field(0, ge=0, description="the published plan's generation; older than held: 409")
    backends: dict[str, int] = Field(default_factory=dict, description='{"IP:PORT": weight 0-32}')
    draining: list[str] = Field(default_factory=list, description="backends taking no new flows")
    forwarding: Forwarding = Field("nat", description="nat (default): DNAT here, replies translated back here; "
                                   "dsr-ipip: IPIP to the backend (VIP on its loopback, same port), "
                                   "replies go straight to the client")

    @field_validator("backends")
    @classmethod
    def _backends(cls, v: dict[str, int]) -> dict[str, int]:
        for backend, weight in v.items():
            check_backend(backend)
            if not 0 <= weight <= 32:
                raise ValueError(f"backend {backend!r}: weight {weight} is outside 0-32")
        return v

    @field_validator("draining")
    @classmethod
    def _draining(cls, v: list[str]) -> list[str]:
        return [check_backend(b) for b in v]


class MaglevServicePut(MaglevServiceSpec):
    """One service of a batch PUT (PUT /v1/maglev/services): its address and its spec."""

    vip: str
    port: int = Field(..., ge=1, le=65535)
    proto: Proto = "tcp"

    @field_validator("vip")
    @classmethod
    def _vip(cls, v: str) -> str:
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise ValueError(f"vip {v!r} is not an IPv4 address") from None
        return v

    @property
    def key(self) -> str:
        return service_key(self.vip, self.port, self.proto)

    def spec(self) -> MaglevServiceSpec:
        return MaglevServiceSpec.model_validate(self.model_dump(exclude={"vip", "port", "proto"}))


class MaglevServiceBatch(WireModel):
    """PUT /v1/maglev/services: every service whose generation moved, for one agent, in one request."""

    services: list[MaglevServicePut] = Field(default_factory=list, max_length=4096)


class MaglevPutResult(WireModel):
    """What the agent did with one service of a batch: ``applied`` (maps written or already equal),
    ``stale`` (an older generation than ``held``: refused, nothing written) or ``failed`` (``code``
    and ``message`` say why; the others of the batch are applied all the same)."""

    key: str
    generation: int
    outcome: Literal["applied", "stale", "failed"]
    held: int = Field(0, description="the generation the agent holds for the service after this call")
    code: str = ""
    message: str = ""


class MaglevBatchResult(WireModel):
    results: list[MaglevPutResult] = Field(default_factory=list)


class MaglevBackendStats(WireModel):
    """One backend as the live BPF maps show it (slots and share of the active Maglev table)."""

    model_config = ConfigDict(extra="ignore")  # the dataplane may report more than we carry

    address: str
    weight: int
    draining: bool = False
    source_nat: bool = False
    slots: int = 0
    share: float = 0
    packets: int = 0
    bytes: int = 0
    active_flows: int = Field(0, description="connection-table flows not yet ended; a drain is over at 0")


class MaglevServiceView(WireModel):
    vip: str
    port: int
    proto: Proto
    backends: dict[str, int] = Field(default_factory=dict)
    draining: list[str] = Field(default_factory=list)
    forwarding: Forwarding = "nat"
    generation: int = Field(0, description="the plan generation the agent holds for it (0: none)")
    stats: list[MaglevBackendStats] = Field(default_factory=list, description="from the live maps, when read")


class MaglevServiceList(WireModel):
    services: list[MaglevServiceView] = Field(default_factory=list)


class AgentHealth(WireModel):
    node_id: str
    ok: bool
    vm_driver: str
    dataplane: bool = Field(..., description="whether the XDP Maglev dataplane is loaded")
    gpus: int = 0
    vms: int = 0
    message: str = ""
    services_withdrawn: str = Field("", description="why the Maglev services were withdrawn (fail-closed site)")


MAX_REPORTED_REPLICAS = 512
MAX_REPORTED_TEXT = 1000  # an observation's error texts (the agent cuts them at 200)
ReplicaName = Annotated[str, Field(min_length=1, max_length=253)]
ServiceKeyText = Annotated[str, Field(min_length=1, max_length=64)]  # VIP:PORT/PROTO


class ObservedReplica(ReplicaObservation):
    """One replica's observation as its agent reports it; ``deployment`` names its record, so
    fabricd checks the replica is placed on the reporting node with one read. Each field a node
    fills is bounded, so what it stores per replica stays the size of a real observation."""

    model_config = ConfigDict(extra="forbid")
    deployment: ReplicaName
    replica_id: ReplicaName
    error: str = Field("", max_length=MAX_REPORTED_TEXT)
    health_error: str = Field("", max_length=MAX_REPORTED_TEXT)
    queue_reads: list[float] = Field(default_factory=list, max_length=16)
    missing: list[str] = Field(default_factory=list, max_length=16)

    def record(self) -> ReplicaObservation:
        return ReplicaObservation(**self.model_dump(exclude={"deployment"}))


class ObservationReport(WireModel):
    """POST /api/ai/nodes/{id}/observations: the engines on a node whose observation changed
    materially since the agent's last report (common.engine_metrics.material), or aged past
    the refresh. Sent without defaults (exclude_defaults) and gzip-compressed (agent.engine_watch):
    about 55-85 bytes a replica on the wire in a report of 8-32."""

    sent_at: float = Field(..., description="the agent's clock when it sent this; fabricd moves each "
                                            "scraped_at onto its own clock by the difference")
    observations: list[ObservedReplica] = Field(default_factory=list, max_length=MAX_REPORTED_REPLICAS)


class ObservationAnswer(WireModel):
    accepted: int = Field(..., description="observations stored")
    ignored: list[str] = Field(default_factory=list, description="replicas fabricd no longer has (deleted)")


class NodeReport(WireModel):
    """What an agent sends to register (POST /api/ai/nodes) and on every heartbeat.

    The node id comes from the caller's certificate (and must equal ``id``); readings of 0
    mean unknown and never overwrite a value fabricd already holds.
    """

    id: str
    address: str = Field(..., description="agent base URL, https://HOST:PORT")
    site: str = Field("", description="FABRIC_SITE; '' is no site")
    failure_domain: str = "default"
    taints: list[str] = Field(default_factory=list)
    gpus: list[GpuInfo] = Field(default_factory=list)
    cpu_free: int = Field(0, ge=0)
    memory_free_gib: float = Field(0, ge=0)
    cached_models: list[str] = Field(default_factory=list)
    vm_driver: str = "libvirt"
    model_jobs: bool = False
    inventory_message: str = ""
    nvswitches: list[str] = Field(default_factory=list, description="HGX NVSwitch PCI addresses")
    kvm: KvmStatus | None = Field(None, description="whether KVM runs guests here; None: not probed (not libvirt)")
    model_disk_free_bytes: int | None = Field(None, ge=0, description="free disk in the model cache (model jobs)")
    services_withdrawn: str = Field("", max_length=500, description="why the agent withdrew its Maglev services "
                                    "(a fail-closed site cut off from fabricd); fabricd pushes them again")
    service_generations: dict[ServiceKeyText, int] = Field(default_factory=dict, max_length=4096, description=(
        "VIP:PORT/PROTO -> the plan generation of each Maglev service its dataplane holds; the routing "
        "controller re-sends a service whose generation differs from the published plan's"))
    observed_replicas: list[ReplicaName] = Field(default_factory=list, max_length=MAX_REPORTED_REPLICAS, description=(
        "the replicas whose engines the agent scrapes and probes and whose observations fabricd accepted "
        "(POST /api/ai/nodes/{id}/observations); the leader never connects to these, and scrapes and probes "
        "the node's other replicas itself"))

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return check_name(v, "node id")

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if not v.startswith(("https://", "http://")):
            raise ValueError(f"address {v!r}: expected https://HOST:PORT")
        return v.rstrip("/")

    @field_validator("site")
    @classmethod
    def _site(cls, v: str) -> str:
        return v if v == "" else check_name(v, "site")


class NodeCertificate(WireModel):
    """A node's identity issued from the cluster CA (PEM text; the key is shown once)."""

    node_id: str
    cert_pem: str
    key_pem: str
    ca_pem: str
