"""The node's GPUs as the heartbeat reports them: NVML merged with sysfs, never dropped.

NVML lists only GPUs the nvidia driver owns. A GPU bound to vfio-pci (in a VM, in the keep-bound
pool, or on a `vfio-pci.ids=` host) is visible only in sysfs, and a GPU that fell off the bus
(Xid 79) is in neither. So each read:
- takes every NVIDIA GPU function from sysfs (PCI id, driver, IOMMU group, NUMA node, 64-bit BAR
  total) and lays NVML's readings over the ones NVML sees (matched by PCI address);
- reports a GPU NVML does not see with its last known name, memory and UUID (remembered across
  reads and, with `state_file`, across restarts) or, never seen, a name and memory from the
  board table below; `readings_live` False tells fabricd to keep the readings it holds;
- reports a GPU that was seen before and is now gone from sysfs or answers 0xffff as
  state "lost", so the scheduler skips it and an operator sees it, while the others stay.
NVSwitch functions (HGX boards) are listed separately for the node report.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.hw.gpu_inventory import Inventory, NvmlInventory
from agent.hw.pci_sysfs import PciFunction, nvidia_functions
from common.schemas import GpuInfo

log = logging.getLogger(__name__)

# device id -> (name as NVML writes it, memory MiB as NVML reports it) for GPUs NVML has never
# shown us (bound to vfio-pci before we started): every data-centre board Fabric places. Device
# ids are NVIDIA's (the PCI ID database; NVIDIA's gpu-admin-tools devid_names.py). A GPU missing
# here reports memory 0, which the scheduler names as "memory unknown" and never places.
BOARDS: dict[str, tuple[str, int]] = {
    "10de:2330": ("NVIDIA H100 80GB HBM3", 81_559),  # H100 SXM5
    "10de:2331": ("NVIDIA H100 PCIe", 81_559),
    "10de:2321": ("NVIDIA H100 NVL", 95_830),  # 94 GB
    "10de:2335": ("NVIDIA H200", 143_771),  # H200 SXM 141 GB
    "10de:233b": ("NVIDIA H200 NVL", 143_771),
    "10de:20b0": ("NVIDIA A100-SXM4-40GB", 40_960),
    "10de:20f1": ("NVIDIA A100-PCIE-40GB", 40_960),
    "10de:20b2": ("NVIDIA A100-SXM4-80GB", 81_920),
    "10de:20b5": ("NVIDIA A100 80GB PCIe", 81_920),
    "10de:26b9": ("NVIDIA L40S", 46_068),
    "10de:27b8": ("NVIDIA L4", 23_034),
    "10de:2901": ("NVIDIA B200", 183_359),
}


@dataclass
class HostInventoryResult(Inventory):
    nvswitches: list[str]


class HostInventory:
    def __init__(self, nvml: NvmlInventory | Any, sysfs_root: Path = Path("/sys"), *, state_file: Path | None = None):
        self.nvml = nvml
        self.sysfs_root = Path(sysfs_root)
        self.state_file = state_file
        self._known: dict[str, GpuInfo] = self._load()
        self._lock = threading.Lock()

    def read(self) -> HostInventoryResult:
        nvml = self.nvml.read()
        functions = nvidia_functions(self.sysfs_root)
        with self._lock:
            gpus, notes = merge(nvml.gpus, [f for f in functions if f.is_gpu], self._known)
            for gpu in gpus:
                if gpu.state == "ok":
                    self._known[gpu.pci] = gpu
            self._save()
        switches = [f.bdf for f in functions if f.is_nvswitch]
        message = nvml.message + ("; " + "; ".join(notes) if notes else "")
        if switches:
            message += f"; {len(switches)} NVSwitches (HGX board)"
        return HostInventoryResult(gpus, message, switches)

    def _load(self) -> dict[str, GpuInfo]:
        if self.state_file is None or not self.state_file.is_file():
            return {}
        try:
            return {k: GpuInfo.model_validate(v) for k, v in json.loads(self.state_file.read_text()).items()}
        except ValueError as exc:
            log.warning("ignoring unreadable %s: %s", self.state_file, exc)
            return {}

    def _save(self) -> None:
        if self.state_file is None:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: v.model_dump() for k, v in self._known.items()}))
        tmp.replace(self.state_file)


def merge(nvml_gpus: list[GpuInfo], functions: list[PciFunction],
          known: dict[str, GpuInfo]) -> tuple[list[GpuInfo], list[str]]:
    """Pure: the GPU list from NVML's view, sysfs's view and what was seen before."""
    by_pci = {g.pci: g for g in nvml_gpus}
    out: list[GpuInfo] = []
    notes: list[str] = []
    seen: set[str] = set()
    for fn in functions:
        seen.add(fn.bdf)
        facts = {"iommu_group": fn.iommu_group, "numa_node": fn.numa_node, "pci_id": fn.pci_id,
                 "bar64_mib": fn.bars64_mib, "driver": fn.driver}
        live = by_pci.get(fn.bdf)
        if live is not None:
            out.append(live.model_copy(update=facts))
            continue
        before = known.get(fn.bdf)
        name, memory = BOARDS.get(fn.pci_id, (f"NVIDIA [{fn.pci_id}]", 0))
        base = before.model_dump() if before else {"index": -1, "uuid": "", "name": name,
                                                   "pci": fn.bdf, "memory_total_mib": memory}
        out.append(GpuInfo(**{**base, **facts, "readings_live": False, "state": "ok", "memory_used_mib": 0}))
        if fn.driver != "vfio-pci":
            notes.append(f"{fn.bdf} is on {fn.driver}, not visible to NVML")
        if not before and fn.pci_id not in BOARDS:
            notes.append(f"{fn.bdf} ({fn.pci_id}) cannot be sized: NVML has not read it and the board "
                         "table does not know it, so it is not placed")
    for gpu in nvml_gpus:  # NVML sees it but sysfs listing missed it (another sysfs root): keep NVML's
        if gpu.pci not in seen:
            seen.add(gpu.pci)
            out.append(gpu)
    for pci, gpu in sorted(known.items()):
        if pci not in seen:
            out.append(gpu.model_copy(update={"state": "lost", "readings_live": False, "driver": "none"}))
            notes.append(f"{pci} is lost (gone from the PCI bus or not answering: Xid 79?)")
    out.sort(key=lambda g: g.pci)
    return out, notes
