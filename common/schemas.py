"""Resource schemas shared by fabricd, the agent's API clients and the gateway.

Desired state (specs written by operators) and observed state (status written by controllers)
are pydantic models stored as JSON in the store under common.keyspace. Every status carries a
human-readable ``message`` saying why it is as it is. Every resource may carry a ``tenant``.
Validation messages name what is wrong; the API turns them into 422 bodies.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from common.mig_catalog import canonical_name
from common.runtimes import OPENAI_INCAPABLE, RUNTIME_NAMES, RUNTIME_TABLE

# Upper bounds on what a spec may ask for (docs/api.md "Limits"): far above any real machine,
# low enough that arithmetic on them stays exact. cpu and memory match the agent's VM limits.
MAX_CPU = 512
MAX_MEMORY_GIB = 8192
MAX_VRAM_GIB = 1024
MAX_MODEL_LEN = 10_000_000
MAX_MODEL_BYTES = 2**50  # 1 PiB
MAX_QUEUE = 1_000_000
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def tenant_name(v: str) -> str:
    """A tenant name as every record that names one accepts it (pydantic validators call this)."""
    if not TENANT.match(v):
        raise ValueError(f"tenant {v!r}: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return v


HF_SOURCE = re.compile(r"^hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$")

RUNTIMES = RUNTIME_NAMES  # vllm, tensorrt-llm, triton, llama.cpp, tei (common/runtimes.py)
ROUTING_STRATEGIES = (
    "equal",
    "least_queue",
    "lowest_ttft",
    "most_free_vram",
    "weighted_capacity",
    "site_local",
    "cost_optimized",
    "energy_optimized",
    "highest_throughput",
    "lowest_failure",
)
# How the gateway picks a replica (docs/gateway.md "Router"): affinity = the VIP first, else the
# session's rendezvous hash; prefix = prefix-cache-aware scoring; round_robin and random pick a
# replica directly (random behaves as the VIP's per-connection hash does: the bench's baseline).
ROUTING_L7 = ("affinity", "prefix", "round_robin", "random")
# How much a deployment's replicas matter when GPUs are short (controlplane.placement.preemption):
# a replica that cannot be placed may preempt replicas of strictly lower classes. Lowest first.
CapacityClass = Literal["opportunistic", "standard", "critical"]
CAPACITY_CLASSES: tuple[str, ...] = get_args(CapacityClass)
Forwarding = Literal["nat", "dsr-ipip"]  # how the XDP program reaches a service's backends (docs/dataplane.md)
REPLICA_PORT = 8000  # every runtime serves its API here (common.runtimes)


def check_name(value: str, what: str = "name") -> str:
    if not isinstance(value, str) or not DNS_LABEL.match(value):
        raise ValueError(
            f"{what} {value!r} is not a DNS label (1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit)"
        )
    return value


def check_runtime(value: str) -> str:
    """A known runtime name. Whether it may launch here (FABRIC_DENY/ALLOW_RUNTIMES) is fabricd's
    setting: runtime_refusal with the lists controlplane.settings read at start."""
    if value not in RUNTIMES:
        raise ValueError(f"runtime {value!r} is unknown; expected one of {', '.join(RUNTIMES)}")
    return value


def check_sha256(value: str | None, what: str) -> str | None:
    if value is not None and not re.match(r"^[0-9a-f]{64}$", value):
        raise ValueError(f"{what} {value!r}: expected 64 lowercase hex characters (SHA-256)")
    return value


def check_source(value: str) -> str:
    if value.startswith("hf://"):
        if not HF_SOURCE.match(value):
            raise ValueError(f"source {value!r}: expected hf://ORG/NAME[@REVISION]")
        return value
    if value.startswith("file://"):
        if not value[len("file://"):].startswith("/"):
            raise ValueError(f"source {value!r}: file:// needs an absolute path (file:///models/x)")
        return value
    if value.startswith("/"):
        return value
    raise ValueError(f"source {value!r}: expected hf://ORG/NAME[@REVISION], file:///PATH or an absolute path")


MAX_ENGINE_ARGS = 64
MAX_ARG_LEN = 512


def check_engine_args(args: list[str]) -> list[str]:
    if len(args) > MAX_ENGINE_ARGS:
        raise ValueError(f"engine_args has {len(args)} entries; at most {MAX_ENGINE_ARGS}")
    for a in args:
        if not a or len(a) > MAX_ARG_LEN or any(c in a for c in "\x00\n\r"):
            raise ValueError(f"engine_args entry {a[:40]!r} must be 1-{MAX_ARG_LEN} characters on one line")
    return args


def _is_number(annotation) -> bool:
    """int, float, or an optional/union of them."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    return all(a in (int, float) for a in args) if args else annotation in (int, float)


class Spec(BaseModel):
    """Every spec and request body: unknown fields refused, and numbers are numbers. Lax pydantic
    would take `false` as 0 and "3" as 3, and JSON's Infinity, NaN and 1e400 (read as inf) would
    be kept, then stored as null; all are refused as 422 naming the field."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value, info: ValidationInfo):
        if isinstance(value, (bool, str)):
            field = cls.model_fields.get(info.field_name or "")
            if field is not None and _is_number(field.annotation):
                raise ValueError(f"expected a number, not {'a boolean' if isinstance(value, bool) else 'a string'}")
        return value


class Status(BaseModel):
    model_config = ConfigDict(extra="ignore")
    phase: str = "Pending"
    message: str = ""


class Resource(Spec):
    name: str = Field(..., json_schema_extra={"pattern": DNS_LABEL.pattern, "maxLength": 63},
                      description="a DNS label: 1-63 lowercase letters, digits or '-'")
    tenant: str | None = None
    created_at: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v)


class ModelStatus(Status):
    digest: str | None = Field(None, description="SHA-256 of the manifest, once a node has verified it")
    revision: str | None = Field(None, description="the commit sha the revision resolved to (hf:// sources)")
    adapter_revisions: dict[str, str] = Field(default_factory=dict,
                                              description="adapter name -> the commit its hf:// revision resolved to")


class LoraAdapter(BaseModel):
    """A LoRA adapter of a model: clients and keys name it as a model; vLLM loads it on demand."""

    name: str = Field(..., description="the model name clients use for it (a DNS label)")
    source: str = Field(..., description="as a model's: hf://ORG/NAME[@REVISION], file:///PATH or a path")
    digest: str | None = Field(None, description="expected digest of the adapter's files (as a model's)")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "adapter name")

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        return check_sha256(v, "adapter digest")

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return check_source(v)


class ModelArtifact(Resource):
    source: str
    description: str | None = Field(None, max_length=1000, description="what the model is for, in words; the "
                                    "gateway's /v1/models lists it")
    adapters: list[LoraAdapter] = Field(default_factory=list, max_length=256)
    max_loaded_adapters: int = Field(4, ge=1, le=256, description="adapters loaded at once per replica")
    license: str | None = None
    residency: str | None = None
    digest: str | None = Field(None, description="expected digest: SHA-256 of the sorted manifest")
    # None (not set) means false; a None default keeps records written before this field equal to
    # new ones wherever unset fields are compared (backup/restore diffs).
    require_checksum: bool | None = Field(None, description="refuse to go Ready without a matching expected digest")
    signature: str | None = Field(None, description="HMAC-SHA256 hex of the digest under FABRIC_MODEL_SIGNING_KEY")
    size_bytes: int | None = Field(None, ge=0, le=MAX_MODEL_BYTES, description="declared size; refused when the node has less free")
    status: ModelStatus = Field(default_factory=lambda: ModelStatus(phase="Registered", message="model registered"))

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return check_source(v)

    @field_validator("adapters")
    @classmethod
    def _adapters(cls, v: list[LoraAdapter], info: ValidationInfo) -> list[LoraAdapter]:
        names = [a.name for a in v]
        if len(set(names)) != len(names) or info.data.get("name") in names:
            raise ValueError("adapter names must be unique and differ from the model's name")
        return v

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        return check_sha256(v, "digest")

    @field_validator("signature")
    @classmethod
    def _signature(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[0-9a-fA-F]{64}$", v):
            raise ValueError("signature: expected 64 hex characters (HMAC-SHA256 of the digest)")
        return v


class GpuRequest(Spec):
    count: int = Field(1, ge=1, le=8, description="whole GPUs per replica, 1-8")
    vram_gib: float = Field(..., gt=0, le=MAX_VRAM_GIB, description="minimum memory per GPU in GiB")
    model: str | None = Field(None, description="GPU model name filter, e.g. H100")
    mig_profile: str | None = Field(None, description="run on a MIG slice of this profile (1g.10gb, 2g.20gb, "
                                                      "3g.40gb, 7g.80gb) instead of a whole GPU")

    @field_validator("mig_profile")
    @classmethod
    def _mig_profile(cls, v: str | None) -> str | None:
        return None if v is None else canonical_name(v)

    @model_validator(mode="after")
    def _one_slice(self) -> GpuRequest:
        if self.mig_profile and self.count != 1:
            raise ValueError("gpu.count must be 1 with gpu.mig_profile (a replica runs on one MIG slice)")
        return self


class InferenceProfile(Resource):
    runtime: str = "vllm"
    gpu: GpuRequest
    cpu: int = Field(..., gt=0, le=MAX_CPU, description=f"vCPUs per replica, 1-{MAX_CPU} (the agent's VM limit)")
    memory_gib: float = Field(..., gt=0, le=MAX_MEMORY_GIB, description=f"GiB per replica, at most {MAX_MEMORY_GIB}")
    max_model_len: int | None = Field(None, gt=0, le=MAX_MODEL_LEN)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, v: str, info: ValidationInfo) -> str:
        # A stored profile loads as it was accepted, even if its runtime is denied since: the
        # reconciler reports its deployments Failed with the reason (runtime_refusal).
        if info.context and info.context.get("stored"):
            return v
        check_runtime(v)
        if v in OPENAI_INCAPABLE:
            raise ValueError(openai_refusal(v))
        return v

    @model_validator(mode="after")
    def _context_length_flag(self) -> InferenceProfile:
        runtime = RUNTIME_TABLE.get(self.runtime)  # None only for a stored record of an unknown runtime
        if self.max_model_len and runtime is not None and not runtime.max_len_flag:
            raise ValueError(f"max_model_len: runtime {self.runtime} has no context-length flag "
                             "(its engine fixes the length when the model is built); leave it unset")
        return self


def runtime_refusal(runtime: str, deny: Collection[str] = (), allow: Collection[str] = ()) -> str | None:
    """Why a profile's runtime may not launch (deny: FABRIC_DENY_RUNTIMES blocks names; allow:
    FABRIC_ALLOW_RUNTIMES, when set, is a strict allowlist), or None. Known runtimes launch by
    default."""
    if runtime in deny:
        return f"runtime {runtime} is denied by FABRIC_DENY_RUNTIMES"
    if allow and runtime not in allow:
        return f"runtime {runtime} is not in FABRIC_ALLOW_RUNTIMES ({', '.join(sorted(allow))})"
    if runtime not in RUNTIMES:
        return f"runtime {runtime} is unknown"
    if runtime in OPENAI_INCAPABLE:  # a profile accepted before this refusal existed
        return openai_refusal(runtime)
    return None


def openai_refusal(runtime: str) -> str:
    """Why a runtime without an OpenAI API (common.runtimes.OPENAI_INCAPABLE) is never placed."""
    return f"runtime {runtime} cannot serve an OpenAI endpoint: {OPENAI_INCAPABLE[runtime]}"


class DeploymentStatus(Status):
    ready_replicas: int = 0
    replicas: int = 0
    scaling: str = Field("", description="the autoscaler's last decision and its reason")
    preempted: int = Field(0, ge=0, description="replicas taken away by preemption, placed again when room returns")
    preempted_by: str = Field("", description="the deployment whose replicas took them")
    # The crash-loop rule (controlplane.reconcile.crashloop): replica failures counted across
    # replacements; reset by a replica Ready long enough or by `deployment restart`.
    failures: int = Field(0, description="replica failures counted across replacements")
    last_failure: str = Field("", description="why the last replica failed")
    last_failure_at: float | None = None
    scaled_at: float | None = Field(None, description="when the wanted replica count last changed (an operator's "
                                    "scale or drain, or the autoscaler): only a call recorded after it wakes a "
                                    "deployment at zero")


class AutoscalingSpec(Spec):
    """When the autoscaler adds or removes replicas (controlplane.scaling.decide)."""

    enabled: bool = True
    min_replicas: int = Field(1, ge=0, le=64)
    max_replicas: int = Field(4, ge=1, le=64)
    scale_out_queue: float = Field(20, ge=0, le=MAX_QUEUE, description="mean waiting requests per ready replica")
    scale_out_seconds: float = Field(30, ge=0, le=3600)
    scale_out_ttft_ms: float | None = Field(None, gt=0, le=3_600_000, description="mean time to first token, ms")
    scale_in_queue: float = Field(1, ge=0, le=MAX_QUEUE)
    scale_in_seconds: float = Field(300, ge=0, le=86400)
    scale_to_zero: bool = False
    scale_to_zero_idle_seconds: float = Field(300, ge=0, le=86400, description="scale to zero only after no "
                                              "request ran or finished on any replica for this long")
    cooldown_seconds: float = Field(60, ge=0, le=3600, description="no change against the last one within this")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        if self.scale_in_queue > self.scale_out_queue:
            raise ValueError(f"scale_in_queue ({self.scale_in_queue:g}) is above scale_out_queue "
                             f"({self.scale_out_queue:g}): the autoscaler would flap")
        return self


class TenantQuota(Spec):
    """What a tenant's deployments may hold together (replicas x their profile's GPUs, CPU cores,
    memory; an unset limit does not limit) and the GPU share preemption may not take from it
    (controlplane.tenancy.quotas)."""

    tenant: str
    max_gpus: int | None = Field(None, ge=0, le=100000, description="whole GPUs (replicas x gpu.count)")
    max_cpu: int | None = Field(None, ge=0, le=10_000_000, description="CPU cores (replicas x cpu)")
    max_memory_gib: float | None = Field(None, ge=0, le=1e9, description="GiB of memory (replicas x memory_gib)")
    guaranteed_gpus: int = Field(0, ge=0, le=100000, description="GPUs of running replicas preemption never "
                                 "takes from this tenant, whatever their capacity class")
    updated_at: float = Field(default_factory=time.time)

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        return tenant_name(v)

    @model_validator(mode="after")
    def _guarantee_within_limit(self) -> TenantQuota:
        if self.max_gpus is not None and self.guaranteed_gpus > self.max_gpus:
            raise ValueError(f"guaranteed_gpus {self.guaranteed_gpus} is above max_gpus {self.max_gpus}")
        return self


class Template(Spec):
    """What every replica of one deployment revision runs (common.rollouts.Revision keeps each)."""

    model: str
    profile: str
    engine_args: list[str] = Field(default_factory=list, description="appended to the profile's extra_args")

    @field_validator("model", "profile")
    @classmethod
    def _refs(cls, v: str, info) -> str:
        return check_name(v, info.field_name)

    @field_validator("engine_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        return check_engine_args(v)


class InferenceDeployment(Template, Resource):
    replicas: int = Field(1, ge=0, le=64)
    revision: int = 1
    preferred_site: str | None = None
    allowed_sites: list[str] = Field(default_factory=list)
    residency: str | None = Field(None, description="copied from the model at create; replicas only on sites "
                                  "of this residency")
    minimum_sites: int = Field(0, ge=0, le=64, description="spread the first replicas over at least this many sites")
    max_replicas_per_site: int | None = Field(None, ge=1, le=64, description="at most this many replicas on one site")
    capacity_class: CapacityClass = Field("standard", description="critical | standard | opportunistic: a replica "
                                          "that cannot be placed may preempt replicas of strictly lower classes")
    autoscaling: AutoscalingSpec | None = None
    status: DeploymentStatus = Field(default_factory=DeploymentStatus)

    def scale_to(self, replicas: int, at: float) -> None:
        """Want ``replicas``; a change is dated in status.scaled_at (every writer of the count calls this)."""
        if replicas != self.replicas:
            self.replicas = replicas
            self.status.scaled_at = at


class EndpointStatus(Status):
    vip: str | None = None
    deleting_since: float | None = Field(None, description="when deletion was asked: the VIP drains, then goes")


class ProviderKey(BaseModel):
    """One API key of an external provider: a file on the gateway host (re-read when it changes)."""

    file: str = Field(..., min_length=1, max_length=4096, description="absolute path of a file holding the key")
    weight: int = Field(1, ge=1, le=1000, description="share of calls relative to the other keys")

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        if not v.startswith("/") or "\0" in v:
            raise ValueError("key file must be an absolute path")
        return v


class ExternalProvider(BaseModel):
    """An OpenAI-compatible API outside the cluster that an endpoint forwards to."""

    url: str = Field(..., max_length=2048, description="base URL ending where /v1 ends, e.g. https://api.example/v1")
    model: str = Field(..., min_length=1, max_length=256, description="the provider's model name")
    keys: list[ProviderKey] = Field(..., min_length=1, max_length=16)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        scheme, sep, rest = v.partition("://")
        host = rest.split("/", 1)[0]
        if scheme not in ("http", "https") or not sep or not host or "@" in host or any(c in v for c in " ?#\0"):
            raise ValueError("url must be http(s)://host[:port][/path] without credentials, query or fragment")
        return v.rstrip("/")


class InferenceEndpoint(Resource):
    deployment: str
    spillover: list[str] = Field(default_factory=list, max_length=8,
                                 description="further deployments, in preference order, used when the ones "
                                             "before are saturated")
    external: ExternalProvider | None = Field(None, description="forward to an OpenAI-compatible API outside "
                                                                "the cluster instead of replicas")
    fallbacks: list[str] = Field(default_factory=list, max_length=8,
                                 description="external endpoints used only when this one has no capacity left")
    openai_compatible: bool = True
    routing: str = "equal"
    routing_l7: str = Field("affinity", description="the gateway's replica choice: " + ", ".join(ROUTING_L7))
    port: int = Field(REPLICA_PORT, ge=1, le=65535, description="VIP port; replicas serve on :8000")
    forwarding: Forwarding = Field("nat", description="how the node's XDP program reaches the replicas: nat "
                                   "(default) or dsr-ipip (IPIP to the replica, replies straight to the client; "
                                   "needs port 8000, the replicas' own port)")
    preferred_site: str | None = None
    allowed_sites: list[str] = Field(default_factory=list)
    residency: str | None = None
    hold_secs: float | None = Field(None, ge=0, le=3600, description="how long the gateway holds a call while a "
                                    "replica starts (0: answer model_loading at once); unset: the gateway's "
                                    "FABRIC_GATEWAY_HOLD_SECS, else the runtime's start budget")
    status: EndpointStatus = Field(default_factory=EndpointStatus)

    @field_validator("deployment")
    @classmethod
    def _deployment(cls, v: str) -> str:
        return check_name(v, "deployment")

    @field_validator("spillover", "fallbacks")
    @classmethod
    def _names(cls, v: list[str], info) -> list[str]:
        for name in v:
            check_name(name, info.field_name)
        if len(set(v)) != len(v):
            raise ValueError(f"{info.field_name} names an entry twice")
        return v

    @field_validator("routing")
    @classmethod
    def _routing(cls, v: str) -> str:
        if v not in ROUTING_STRATEGIES:
            raise ValueError(f"routing {v!r} is unknown; expected one of {', '.join(ROUTING_STRATEGIES)}")
        return v

    @field_validator("routing_l7")
    @classmethod
    def _routing_l7(cls, v: str) -> str:
        if v not in ROUTING_L7:
            raise ValueError(f"routing_l7 {v!r} is unknown; expected one of {', '.join(ROUTING_L7)}")
        return v

    @field_validator("forwarding")
    @classmethod
    def _dsr(cls, v: str, info: ValidationInfo) -> str:
        """What the agent would refuse for dsr-ipip, refused here before anything is written
        (port and external are declared before forwarding, so info.data holds them)."""
        if v == "dsr-ipip":
            if info.data.get("external") is not None:
                raise ValueError("dsr-ipip needs replicas; an external endpoint has none")
            port = info.data.get("port", REPLICA_PORT)
            if port != REPLICA_PORT:
                raise ValueError(f"dsr-ipip keeps the VIP's port on the replica, which serves on {REPLICA_PORT}; "
                                 f"port {port} needs forwarding nat")
        return v


class KvmStatus(BaseModel):
    """Whether the node's KVM runs a guest with the guests' CPU model (agent.hw.kvm's probe)."""

    usable: bool
    reason: str = ""
    checked_at: float = Field(0, description="when the probe ran (unix seconds); kept per boot")


class GpuInfo(BaseModel):
    """One physical GPU as the agent's inventory sees it (0 means unknown for readings)."""

    index: int
    uuid: str
    name: str
    pci: str = Field(..., description="sysfs form 0000:bb:dd.f")
    memory_total_mib: int
    memory_used_mib: int = 0
    temperature_c: float = 0
    power_w: float = 0
    ecc_uncorrected: int = 0
    mig_mode: bool = False
    mig_profile: str | None = Field(None, description="set on a MIG slice: its profile (pci is the slice id)")
    mig_parent: str | None = Field(None, description="set on a MIG slice: the parent GPU's PCI address")
    # Where the reading came from and what sysfs says (agent.hw.host_inventory). A GPU bound
    # to vfio-pci is invisible to NVML: it is reported from sysfs with readings_live False, and
    # fabricd keeps its last live readings; a live reading of 0 is a real 0.
    driver: str = Field("", description="host driver: nvidia, vfio-pci, none; '' unknown")
    state: str = Field("ok", description="ok | lost (fell off the bus, Xid 79: not placeable)")
    readings_live: bool = True
    iommu_group: str = ""
    numa_node: int = -1
    pci_id: str = Field("", description="vendor:device, e.g. 10de:2330")
    bar64_mib: int = Field(0, description="total of the 64-bit BARs (sizes the guest MMIO window)")
    remapped_rows_pending: bool = False  # a row remap waits for a GPU reset
    remapped_rows_failed: bool = False  # row remapping failed: the GPU needs service


class Node(Spec):
    id: str
    address: str = Field(..., description="agent base URL, https://HOST:PORT")
    site: str = Field("", description="the agent's FABRIC_SITE; '' is no site (excluded where sites are restricted)")
    failure_domain: str = "default"
    taints: list[str] = Field(default_factory=list)
    cordoned: str = Field("", max_length=300, description="why an admin closed it to new replicas ('': open); "
                          "set by POST /api/ai/nodes/{id}/drain, cleared by .../uncordon, never by a heartbeat")
    # True when absent: a record written before nodes had roles is a balancer, as every node was
    # then, so an upgraded fleet keeps serving its VIPs. A registration always sets it (first_role).
    balancer: bool = Field(True, description=(
        "a balancer node: it carries every VIP's Maglev service and announces the VIPs over BGP "
        "(docs/dataplane.md); taken from its grant at registration, changed by an admin with "
        "PUT /api/ai/nodes/{id}/role, never by a heartbeat"))
    gpus: list[GpuInfo] = Field(default_factory=list)
    cpu_free: int = 0
    memory_free_gib: float = 0
    cached_models: list[str] = Field(default_factory=list)
    vm_driver: str = "libvirt"
    model_jobs: bool = Field(False, description="its agent materializes models (replicas wait for Ready)")
    inventory_message: str = ""
    nvswitches: list[str] = Field(default_factory=list, description="HGX NVSwitch PCI addresses")
    kvm: KvmStatus | None = Field(None, description="the node's KVM probe; None: not reported (not libvirt)")
    replica_networks: list[str] = Field(default_factory=list, max_length=16, description=(
        "admin-set CIDRs its replicas' addresses must lie in; empty: private addresses (loopback only "
        "when the agent itself is on loopback)"))
    services_withdrawn: str = Field("", description="why its agent withdrew its Maglev services (a fail-closed "
                                    "site cut off from fabricd; agent.fail_closed); the routing controller "
                                    "pushes them again")
    service_generations: dict[str, int] = Field(default_factory=dict, description=(
        "VIP:PORT/PROTO -> the plan generation of each Maglev service its agent reported holding at the last "
        "heartbeat; the routing controller re-sends where it differs from the published plan"))
    observed_replicas: list[str] = Field(default_factory=list, description=(
        "the replicas whose engines its agent scrapes and probes and whose observations fabricd accepted "
        "(common.engine_metrics, at its last heartbeat): the routing controller and the reconcile probes read "
        "those from the store and never connect to these engines; the node's other replicas (created before "
        "the agent observed engines, say) are scraped and probed from fabricd"))
    model_disk_free_bytes: int | None = Field(None, ge=0, description="free disk in the agent's model cache; "
                                              "placement refuses a model declared larger (None: not reported)")
    last_heartbeat: float = 0

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        return check_name(v, "node id")

    @field_validator("replica_networks")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        import ipaddress

        try:
            return [str(ipaddress.ip_network(n, strict=False)) for n in v]
        except ValueError as exc:
            raise ValueError(f"replica_networks: {exc}") from None

    @field_validator("site")
    @classmethod
    def _site(cls, v: str) -> str:
        return v if v == "" else check_name(v, "site")


class Site(Resource):
    """A place replicas run (nodes report it: FABRIC_SITE on the agent). docs/sites.md."""

    region: str = ""
    description: str = ""
    residency: str | None = Field(None, description="the data-residency zone this site is in (e.g. india); "
                                  "models, deployments and endpoints with that residency may use it")
    cost_tier: float = Field(1.0, ge=0, le=1000, description="relative cost; lower is cheaper (cost_optimized)")
    failover_sites: list[str] = Field(default_factory=list, description="where site_local spills when this "
                                      "site is the preferred one and it is saturated")
    peer_url: str | None = Field(None, description="that site's fabricd, https://HOST:PORT (model replicate)")
    fail_closed_unix: float | None = Field(None, ge=0, description="a disconnected site may serve its last "
                                           "snapshot until this Unix time (recorded; see docs/sites.md)")

    @field_validator("residency")
    @classmethod
    def _residency(cls, v: str | None) -> str | None:
        return None if v is None else check_name(v, "residency")

    @field_validator("failover_sites")
    @classmethod
    def _failover(cls, v: list[str]) -> list[str]:
        if len(v) > 16:
            raise ValueError(f"failover_sites has {len(v)} entries; at most 16")
        return [check_name(s, "failover site") for s in v]

    @field_validator("peer_url")
    @classmethod
    def _peer(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not re.match(r"^https?://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?/?$", v) or len(v) > 256:
            raise ValueError(f"peer_url {v[:80]!r}: expected http(s)://HOST[:PORT] with no path")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _not_self(self) -> Site:
        if self.name in self.failover_sites:
            raise ValueError(f"failover_sites: site {self.name} cannot fail over to itself")
        return self


ReplicaPhase = Literal["Pending", "Starting", "Ready", "Unhealthy", "Draining", "Deleting", "Failed"]


class Replica(BaseModel):
    replica_id: str
    deployment: str
    ordinal: int
    revision: int = 1
    node: str
    gpus: list[str] = Field(default_factory=list, description="PCI addresses reserved for it")
    runtime: str = Field("vllm", description="the profile's runtime when it was created (health and metrics paths)")
    vm_id: str | None = None
    host: str | None = Field(None, description="address the engine serves on (IP or hostname)")
    port: int = REPLICA_PORT
    dsr_vips: list[str] = Field(default_factory=list, description="VIPs its VM was created to answer for "
                                "(dsr-ipip endpoints); only those endpoints route to it through Maglev")
    phase: ReplicaPhase = "Pending"
    ready: bool = False
    ready_since: float | None = None
    draining: bool = False
    drain_started: float | None = None
    drain_deadline: float | None = None
    health_failures: int = 0
    message: str = ""
    created_at: float = Field(default_factory=time.time)


class ReplicaObservation(BaseModel):
    """What the routing controller last scraped from a replica's /metrics (observed state)."""

    replica_id: str
    scraped_at: float
    ok: bool
    error: str = ""
    queue_depth: float = Field(0, description="requests waiting: the highest of queue_reads (routing.hold)")
    queue_reads: list[float] = Field(default_factory=list, description="the waiting gauge at this scrape and "
                                     "the ones before it that the hold keeps, oldest first")
    running: float = 0
    kv_cache_usage: float = 0
    ttft_p50_s: float | None = None
    tokens_per_s: float | None = None
    failure_ratio: float | None = None
    # Cumulative engine counters at this scrape (rollout windows take deltas of these).
    finished_total: float | None = None
    failed_total: float | None = None
    ttft_sum_s: float | None = None
    ttft_count: float | None = None
    missing: list[str] = Field(default_factory=list, description="readings the engine's page did not carry "
                               "(queue, running, kv_cache, ttft, tokens, failures); their fields read 0/None")
    # controlplane.routing.stall: requests running, no generated tokens since stalled_since
    stalled_since: float | None = None
    stalled: bool = Field(False, description="running requests made no token progress for FABRIC_STALL_SECS")
    health: int | None = Field(None, description=(
        "the HTTP status of the engine's GET /health probed with this scrape by the node's agent (0: no "
        "answer, health_error says why); None: not probed (fabricd's own scrapes: its reconcile probes)"))
    health_error: str = ""


class ApiKeyRecord(BaseModel):
    """An inference API key at rest: only HMAC-SHA256 digests, never the secret."""

    id: str
    name: str
    prefix: str
    hash: str
    previous_hash: str | None = None
    previous_valid_until: float | None = None
    endpoint: str
    model: str | None = None
    tenant: str | None = None
    ttl_secs: int = 0
    expires_at: float | None = None
    request_quota: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    priority: str | None = Field(None, description="the band of calls without x-request-priority")
    fallbacks: list[str] = Field(default_factory=list, description="external endpoints this key's prompts may "
                                                                   "leave the cluster for")
    shadow_limits: list[str] = Field(default_factory=list, description="limits only reported for this key's calls "
                                                                       "(request_quota, tokens_per_minute, "
                                                                       "max_concurrent, FABRIC_<LIMIT>)")
    owner: str | None = Field(None, description="the console user a playground key was made for (None: any "
                              "other key); only that user may revoke it through the playground route")
    created_at: float = Field(default_factory=time.time)
