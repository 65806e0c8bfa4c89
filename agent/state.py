"""What one agent process holds while it serves: built once by `fabric-agent serve`, passed
into the API app and the heartbeat loop (never imported as a global).

The hardware pieces are reached through the small Protocols below so tests and the dry-run
mode can hand in fakes (fake NVML, fake sysfs) while production hands in NVML, /sys and the
XDP dataplane. Their results are normalised by the helpers here so the API does not depend on
each implementation's exact return type.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

if TYPE_CHECKING:
    from agent.hw.kvm import KvmProbe
    from agent.models.jobs import ModelJobs

from agent.hw.vfio import GpuBinder
from agent.service_generations import ServiceGenerations
from agent.settings import AgentSettings
from agent.vm.base import VmDriver
from common.schemas import GpuInfo, KvmStatus


class InventorySource(Protocol):
    def read(self) -> Any:
        """An object with ``gpus`` (list of GpuInfo) and ``message`` (why empty/partial)."""
        ...


class DataplaneLike(Protocol):
    def put_service(self, vip: str, port: int, proto: str, backends: dict[str, int], draining=(),
                    forwarding: str = "nat") -> bool: ...

    def delete_service(self, vip: str, port: int, proto: str) -> bool: ...

    def get_service(self, vip: str, port: int, proto: str) -> Any: ...

    def list_services(self) -> list[Any]: ...

    def readiness(self) -> list[tuple[str, int, str, int, int]]:
        """(vip, port, proto, backends taking new flows, backends) per service, cheaply."""
        ...


@dataclass
class AgentState:
    node_id: str
    vm_driver: VmDriver
    inventory: InventorySource
    binder: GpuBinder | None = None  # None: this driver never binds GPUs (dry-run, lab)
    dataplane: DataplaneLike | None = None  # None: --no-dataplane or BPF unavailable
    dataplane_message: str = ""
    services: ServiceGenerations = field(default_factory=ServiceGenerations)  # plan generations, in order
    bgp: Any = None  # agent.bgp.announcer.BgpAnnouncer when FABRIC_BGP=1, else None
    site: str = ""  # FABRIC_SITE; '' is no site
    failure_domain: str = "default"
    taints: list[str] = field(default_factory=list)
    models_dir: Path | None = None  # cached models are the directories under it
    models: ModelJobs | None = None  # model jobs and the by-digest cache (agent.models)
    kvm: KvmProbe | None = None  # does KVM run guests here (agent.hw.kvm); None: not a libvirt node
    settings: AgentSettings = field(default_factory=AgentSettings)  # read once at start (agent/settings.py)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    kv_index: Any = None  # agent.kv_index.service.KvIndexService: the replicas' KV blocks (docs/kv-events.md)
    fail_closed: Any = None  # agent.fail_closed.FailClosed: withdraws services when a fail-closed site is cut off
    engines: Any = None  # agent.engine_watch.EngineWatch: scrapes this host's engines and reports to fabricd
    # Serialises bind/release and VM create/delete: the kernel and libvirt are not happy with
    # two concurrent rebinds of one IOMMU group, and create-by-replica-id must be idempotent.
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class InventoryView:
    gpus: list[GpuInfo]
    message: str
    nvswitches: tuple[str, ...] = ()  # HGX NVSwitch functions (agent.hw.host_inventory)


def read_inventory(source: InventorySource) -> InventoryView:
    """Read the inventory; a source that raises gives an empty list with the reason."""
    try:
        inv = source.read()
    except Exception as exc:  # noqa: BLE001 - a broken driver must not take the agent down; say why instead
        return InventoryView([], f"GPU inventory failed: {type(exc).__name__}: {exc}")
    gpus = [g if isinstance(g, GpuInfo) else GpuInfo.model_validate(_as_dict(g)) for g in inv.gpus]
    return InventoryView(gpus, getattr(inv, "message", "") or "", tuple(getattr(inv, "nvswitches", ()) or ()))


def read_kvm(probe: KvmProbe | None) -> KvmStatus | None:
    """The KVM verdict for the inventory and the heartbeat; None when this node has no probe."""
    if probe is None:
        return None
    verdict = probe.state()
    return KvmStatus(usable=verdict.usable, reason=verdict.reason, checked_at=verdict.checked_at)


def _as_dict(obj: Any) -> dict:
    if isinstance(obj, dict):
        return obj
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    return dict(vars(obj))


def as_dict(obj: Any) -> dict:
    """A plain dict from a dataclass, pydantic model, dict or simple object."""
    return _as_dict(obj)
