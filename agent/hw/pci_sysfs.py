"""NVIDIA PCI functions as sysfs shows them, whatever driver holds them.

NVML sees only GPUs the nvidia driver owns; a GPU bound to vfio-pci (in a VM, or kept in the
pool) is visible only here. Per function we read what the kernel keeps in
/sys/bus/pci/devices/<bdf>/: vendor, device, class, the driver link, the iommu_group link,
numa_node (-1: no affinity) and `resource` (one "start end flags" line per BAR; a BAR's size
is end - start + 1, flag 0x00100000 marks a 64-bit BAR).

GPUs are vendor 0x10de with class 0x0300xx (VGA) or 0x0302xx (3D controller); NVSwitches on
HGX boards are vendor 0x10de class 0x0680xx ("bridge, other"). The sysfs root is a parameter so
agent.hw.sysfs_fake trees and a real /sys run the same code.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_PCI = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalise_pci(bus_id: str | bytes) -> str:
    """NVML's `00000000:3B:00.0` (or `3B:00.0`) -> sysfs `0000:3b:00.0`."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    match = _PCI.match(bus_id.strip().rstrip("\x00"))
    if not match:
        raise ValueError(f"not a PCI address: {bus_id!r}")
    domain, bus, dev, fn = match.groups()
    domain_value = int(domain, 16) if domain else 0
    return f"{domain_value:04x}:{bus.lower()}:{dev.lower()}.{fn}"


NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
NVSWITCH_CLASS = "0x0680"
IORESOURCE_MEM_64 = 0x00100000
MIB = 1024 * 1024


@dataclass(frozen=True)
class PciFunction:
    bdf: str
    vendor: str
    device: str
    pci_class: str
    driver: str  # "none" when unbound
    iommu_group: str  # "" when the host has no IOMMU groups
    numa_node: int
    bars_mib: tuple[int, ...]  # sizes of BAR0..5 in MiB (0: absent or under 1 MiB)
    bars64_mib: int  # total of the 64-bit BARs, what the guest's 64-bit aperture must hold

    @property
    def pci_id(self) -> str:
        return f"{self.vendor.removeprefix('0x')}:{self.device.removeprefix('0x')}"

    @property
    def is_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.pci_class.startswith(GPU_CLASSES)

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.pci_class.startswith(NVSWITCH_CLASS)


def parse_resource(text: str) -> tuple[tuple[int, ...], int]:
    """(BAR0..5 sizes in MiB, total MiB of the 64-bit BARs) from a sysfs `resource` file."""
    sizes: list[int] = []
    total64 = 0
    for line in text.splitlines()[:6]:
        try:
            start, end, flags = (int(x, 16) for x in line.split())
        except ValueError:
            sizes.append(0)
            continue
        size = end - start + 1 if end > start else 0
        sizes.append(size // MIB)
        if flags & IORESOURCE_MEM_64:
            total64 += size
    return tuple(sizes), -(-total64 // MIB)


def read_function(root: Path, bdf: str) -> PciFunction:
    dev = root / "bus/pci/devices" / bdf
    numa = read_attr(dev / "numa_node")
    bars, bars64 = parse_resource(read_attr(dev / "resource"))
    return PciFunction(
        bdf=bdf,
        vendor=read_attr(dev / "vendor").lower(),
        device=read_attr(dev / "device").lower(),
        pci_class=read_attr(dev / "class").lower(),
        driver=link_name(dev / "driver") or "none",
        iommu_group=link_name(dev / "iommu_group") or "",
        numa_node=int(numa) if numa.lstrip("-").isdigit() else -1,
        bars_mib=bars,
        bars64_mib=bars64,
    )


def nvidia_functions(root: Path = Path("/sys")) -> list[PciFunction]:
    """Every NVIDIA GPU and NVSwitch function on the host, in PCI order."""
    devices = root / "bus/pci/devices"
    out = []
    for entry in sorted(devices.iterdir()) if devices.is_dir() else []:
        if read_attr(entry / "vendor").lower() != NVIDIA_VENDOR:
            continue
        fn = read_function(root, entry.name)
        if fn.is_gpu or fn.is_nvswitch:
            out.append(fn)
    return out


def link_name(path: Path) -> str | None:
    """The last component of a symlink's target (a driver or group name); None if not a link."""
    try:
        return Path(os.readlink(path)).name
    except OSError:
        return None


def read_attr(path: Path) -> str:
    """A sysfs/proc attribute stripped; '' when absent or unreadable."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""
