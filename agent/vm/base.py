"""The VM driver interface the agent drives; chosen by configuration.

  libvirt  production: QEMU/KVM guests with VFIO GPUs booted from the golden image
  lab      a network namespace per replica on the node's bridge running fabric-engine-sim
  dry-run  no VM and no GPU bind: one fabric-engine-sim process per replica on a loopback port

Drivers are idempotent by replica id: create of an existing replica returns its status,
delete of an absent one returns False. Tests use the real drivers where they run here
(libvirt's test:///default, netns, loopback processes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

VmState = Literal["running", "starting", "stopped", "failed", "absent"]


@dataclass(frozen=True)
class VmSpec:
    replica_id: str
    deployment: str
    model_name: str  # the name the engine serves (OpenAI "model")
    model_source: str  # hf://..., file://... or an absolute host path
    runtime: str = "vllm"
    gpus: tuple[str, ...] = ()  # PCI addresses (0000:bb:dd.f), already bound to vfio-pci
    gpu_memory_mib: int = 0  # per GPU, sizes the 64-bit MMIO window
    cpu: int = 1
    memory_gib: float = 1
    port: int = 8000
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    engine_args: dict[str, str] = field(default_factory=dict)  # lab/dry-run engine knobs
    model_dir: str | None = None  # the verified digest directory; the guest sees it read-only at /models
    # The model's LoRA adapters (agent.models.adapter_sets): the guest sees this directory read-only
    # at /adapters (one directory per adapter); vLLM starts with --enable-lora and these bounds.
    adapters_dir: str | None = None
    max_loras: int | None = None
    max_lora_rank: int | None = None
    dsr_vips: tuple[str, ...] = ()  # VIPs of dsr-ipip services: decapsulate IPIP, hold them on loopback


@dataclass(frozen=True)
class VmStatus:
    id: str  # equals the replica id
    state: VmState
    host: str | None = None  # where the engine answers (IP), None until known
    port: int = 8000
    message: str = ""


class VmDriver(Protocol):
    name: str

    def create(self, spec: VmSpec) -> VmStatus: ...

    def get(self, vm_id: str) -> VmStatus | None: ...

    def list(self) -> list[VmStatus]: ...

    def delete(self, vm_id: str) -> bool: ...
