"""The pure half of agent.hw.vfio: facts read from sysfs in, the writes to make (or why not) out.

Tested with plain data; VfioBinder reads the facts and applies the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from agent.hw.pci_sysfs import read_attr

VFIO_DRIVER = "vfio-pci"
BRIDGE_CLASS_PREFIX = "0x0604"
NVIDIA_VENDOR = "0x10de"
LOST_VENDOR = "0xffff"  # config space of a device that fell off the bus


@dataclass
class BindResult:
    bdf: str
    functions: list[str]
    original_drivers: dict[str, str]  # bind: driver each function had; release: driver it returned to
    message: str


@dataclass(frozen=True)
class FunctionFacts:
    bdf: str
    driver: str  # "none" when unbound
    override: str  # "" when unset
    pci_class: str
    sriov_numvfs: int
    vendor: str = NVIDIA_VENDOR
    device: str = ""

    @property
    def pci_id(self) -> str:
        return f"{self.vendor.removeprefix('0x')}:{self.device.removeprefix('0x')}"


@dataclass(frozen=True)
class GroupFacts:
    bdf: str
    group: str | None
    host_has_groups: bool
    vfio_driver_present: bool
    functions: list[FunctionFacts] = field(default_factory=list)
    vfio_ids: frozenset[str] = frozenset()  # ids vfio-pci claims at probe (vfio-pci.ids=)
    keep_bound: bool = False  # FABRIC_VFIO_KEEP_BOUND=1: release leaves GPUs on vfio-pci


@dataclass(frozen=True)
class Write:
    path: str  # relative to the sysfs root
    value: str


@dataclass(frozen=True)
class FunctionPlan:
    bdf: str
    needs_free: bool  # must have no holders before its unbind
    writes: list[Write]


@dataclass(frozen=True)
class Plan:
    functions: list[str]
    steps: list[FunctionPlan]
    refusal: str | None = None


def _moving(facts: GroupFacts) -> tuple[list[FunctionFacts], str | None]:
    """The group's functions that change driver (bridges stay) and why the group may not move."""
    moving = [f for f in facts.functions if not f.pci_class.startswith(BRIDGE_CLASS_PREFIX)]
    return moving, _common_refusal(facts)


def plan_bind(facts: GroupFacts) -> Plan:
    """Pure: what to write to move the group to vfio-pci (empty steps when already there)."""
    moving, refusal = _moving(facts)
    refusal = refusal or _foreign_refusal(facts)
    names = [f.bdf for f in moving]
    if refusal:
        return Plan(names, [], refusal)
    if not facts.vfio_driver_present:
        return Plan(names, [], "the vfio-pci driver is not loaded on this host (run: modprobe vfio-pci)")
    steps = []
    for fn in moving:
        if fn.driver == VFIO_DRIVER and (fn.override == VFIO_DRIVER or fn.pci_id in facts.vfio_ids):
            continue  # already there (vfio-pci.ids= hosts need no override to stay)
        writes = [Write(f"bus/pci/devices/{fn.bdf}/driver_override", VFIO_DRIVER)]
        if fn.driver not in ("none", VFIO_DRIVER):
            writes.append(Write(f"bus/pci/drivers/{fn.driver}/unbind", fn.bdf))
        if fn.driver != VFIO_DRIVER:
            writes.append(Write("bus/pci/drivers_probe", fn.bdf))
        steps.append(FunctionPlan(fn.bdf, fn.driver not in ("none", VFIO_DRIVER), writes))
    return Plan(names, steps)


def plan_release(facts: GroupFacts) -> Plan:
    """Pure: what to write so each function's own driver takes it back."""
    moving, refusal = _moving(facts)
    names = [f.bdf for f in moving]
    if refusal:
        return Plan(names, [], refusal)
    steps = []
    if facts.keep_bound:
        return Plan(names, [])  # the pool keeps them on vfio-pci for the next VM
    for fn in moving:
        if fn.driver not in (VFIO_DRIVER, "none") and fn.override != VFIO_DRIVER:
            continue  # already with its own driver
        writes = []
        if fn.pci_id in facts.vfio_ids:
            # vfio-pci.ids= makes vfio-pci this device's own driver: a reprobe binds it again.
            if fn.override == VFIO_DRIVER:
                steps.append(FunctionPlan(fn.bdf, False, [
                    Write(f"bus/pci/devices/{fn.bdf}/driver_override", "\n")]))
            continue
        if fn.override == VFIO_DRIVER:
            # An empty write clears driver_override (the kernel then shows "(null)").
            writes.append(Write(f"bus/pci/devices/{fn.bdf}/driver_override", "\n"))
        if fn.driver == VFIO_DRIVER:
            writes.append(Write(f"bus/pci/drivers/{VFIO_DRIVER}/unbind", fn.bdf))
        writes.append(Write("bus/pci/drivers_probe", fn.bdf))
        steps.append(FunctionPlan(fn.bdf, fn.driver == VFIO_DRIVER, writes))
    return Plan(names, steps)


def _foreign_refusal(facts: GroupFacts) -> str | None:
    """Bind only: a group with another vendor's device (not a bridge) must not move."""
    foreign = [f for f in facts.functions
               if f.vendor not in (NVIDIA_VENDOR, LOST_VENDOR) and not f.pci_class.startswith(BRIDGE_CLASS_PREFIX)]
    if foreign:
        members = ", ".join(f"{f.bdf} ({f.pci_id}, class {f.pci_class}, driver {f.driver})" for f in facts.functions)
        return (
            f"IOMMU group {facts.group} also holds non-NVIDIA devices "
            f"({', '.join(f.bdf for f in foreign)}); moving the group to vfio-pci would take them from "
            f"the host. Group members: {members}. Move the GPU to a slot with ACS, or exclude it"
        )
    return None


def _common_refusal(facts: GroupFacts) -> str | None:
    if not facts.host_has_groups:
        return (
            "this host has no IOMMU groups: enable VT-d/AMD-Vi in firmware and boot with "
            "intel_iommu=on iommu=pt (or amd_iommu=on)"
        )
    if facts.group is None:
        return f"{facts.bdf} is in no IOMMU group, so it cannot be given to a VM"
    for fn in facts.functions:
        if fn.sriov_numvfs > 0:
            return (
                f"{fn.bdf} has {fn.sriov_numvfs} SR-IOV virtual functions enabled; "
                "disable them (echo 0 > sriov_numvfs) before passing the whole device through"
            )
    return None



def read_vfio_ids(proc_root: Path = Path("/proc"), modprobe_dir: Path = Path("/etc/modprobe.d")) -> frozenset[str]:
    """PCI ids the host gives to vfio-pci at probe: `vfio-pci.ids=` on the kernel command line
    and `options vfio-pci ids=` (or vfio_pci) in modprobe.d; lowercase 'vvvv:dddd'."""
    texts = [read_attr(proc_root / "cmdline")]
    if modprobe_dir.is_dir():
        texts += [read_attr(path) for path in sorted(modprobe_dir.glob("*.conf"))]
    ids: set[str] = set()
    for text in texts:
        for match in re.finditer(r"(?:vfio[-_]pci\.ids=|options\s+vfio[-_]pci\s+(?:\S+\s+)*?ids=)([0-9a-fA-F:,]+)", text):
            ids.update(part.lower()[:9] for part in match.group(1).split(",") if len(part) >= 9)
    return frozenset(ids)
