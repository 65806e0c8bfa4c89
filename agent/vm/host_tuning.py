"""What the host offers a GPU guest, read once per VM: hugepages, the GPUs' NUMA node and its
CPUs, and whether libvirt + virtiofsd can export a share read-only.

The decisions are pure functions of text read from /sys, `virtiofsd --version` and libvirt's
version number, so every branch is tested with plain strings; `read_*` are the thin readers.

- Hugepages (`--hugepages auto|1G|2M|off`): auto takes 1 GiB pages when the host has reserved
  some (`nr_hugepages` of the 1048576kB pool > 0), else 2 MiB pages when that pool has some,
  else none (memfd, 4 KiB). VFIO pins all guest RAM at start, so large pages cut pinning time
  and IOTLB pressure; a pool that is too small fails at VM start with libvirt's message.
- NUMA (`--numa auto|off`): all the VM's GPUs' `numa_node`; when they agree (and the host has
  that node) vCPUs are pinned round-robin to that node's CPUs, memory is bound there
  (numatune strict) and the guest sees one NUMA cell. GPUs on different nodes (or -1, no
  affinity) leave placement to the kernel, with the reason kept.
- virtiofs read-only: libvirt >= 11.0 with the Rust virtiofsd >= 1.13 accepts `<readonly/>`
  on a virtiofs filesystem. Older pairs reject the whole domain at define ("virtiofs does not
  yet support read-only mode"), so we export a read-only bind mount of the model directory
  instead and the guest mounts it `ro` (agent.vm.ro_bind).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from agent.vm.mmio import guest_mmio64_mib
from common.errors import InvalidInput

HUGEPAGE_CHOICES = ("auto", "1G", "2M", "off")
PAGE_KIB = {"1G": 1_048_576, "2M": 2048}
VIRTIOFSD_PATHS = ("/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd", "/usr/bin/virtiofsd")
LIBVIRT_RO_VIRTIOFS = 11_000_000  # libvirt encodes 11.0.0 as 11 * 1_000_000
VIRTIOFSD_RO = (1, 13)


@dataclass(frozen=True)
class HostTuning:
    """Everything about the host that shapes the domain XML beyond the spec."""

    hugepage_kib: int = 0  # 0: memfd with the kernel's 4 KiB pages
    numa_node: int | None = None  # pin vCPUs and memory here; None: no pinning
    host_cpus: tuple[int, ...] = ()  # the node's CPUs, vCPUs are pinned round-robin onto them
    virtiofs_readonly: bool = False  # libvirt/virtiofsd take <readonly/> on virtiofs
    nvswitches: tuple[str, ...] = ()  # HGX full passthrough: the board's NVSwitch functions
    mmio64_mib: int = 0  # the 64-bit aperture from sysfs BAR sizes; 0: estimate from memory
    note: str = ""  # why a tuning is off (shown in the create message and logs)


def choose_hugepages(setting: str, pools: dict[int, int]) -> tuple[int, str]:
    """(page size in KiB or 0, why). `pools` maps page size KiB -> nr_hugepages reserved."""
    if setting not in HUGEPAGE_CHOICES:
        raise InvalidInput(f"hugepages {setting!r}: expected one of {', '.join(HUGEPAGE_CHOICES)}")
    if setting == "off":
        return 0, "hugepages off (--hugepages off)"
    if setting in PAGE_KIB:
        return PAGE_KIB[setting], f"hugepages {setting} (--hugepages {setting})"
    for name in ("1G", "2M"):
        if pools.get(PAGE_KIB[name], 0) > 0:
            return PAGE_KIB[name], f"hugepages {name}: {pools[PAGE_KIB[name]]} pages reserved on the host"
    return 0, "no hugepages reserved on the host (nr_hugepages is 0 for 1G and 2M): 4 KiB memfd pages"


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Kernel cpulist syntax '0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


def choose_numa(gpu_nodes: list[int], node_cpus: dict[int, tuple[int, ...]]) -> tuple[int | None, str]:
    """The NUMA node to pin to (None for none) and why, from each GPU's numa_node."""
    if not gpu_nodes:
        return None, "no GPUs: no NUMA pinning"
    distinct = sorted(set(gpu_nodes))
    if len(distinct) > 1:
        return None, f"GPUs sit on NUMA nodes {', '.join(map(str, distinct))}: no single node to pin to"
    node = distinct[0]
    if node < 0:
        return None, "the GPUs report no NUMA affinity (numa_node -1)"
    if not node_cpus.get(node):
        return None, f"NUMA node {node} has no CPUs on this host"
    return node, f"pinned to NUMA node {node}, the GPUs' node"


def virtiofsd_version(text: str) -> tuple[str, tuple[int, ...]]:
    """('rust'|'c'|'unknown', version) from `virtiofsd --version` output.

    Rust: 'virtiofsd 1.13.0'; QEMU's C daemon: 'virtiofsd version 7.2.22 (Debian ...)'."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    c_style = re.match(r"virtiofsd version (\d+(?:\.\d+)*)", line)
    if c_style:
        return "c", tuple(int(x) for x in c_style.group(1).split("."))
    rust = re.match(r"virtiofsd (?:v)?(\d+(?:\.\d+)*)", line)
    if rust:
        return "rust", tuple(int(x) for x in rust.group(1).split("."))
    return "unknown", ()


def readonly_share_supported(libvirt_version: int, virtiofsd_text: str) -> tuple[bool, str]:
    kind, version = virtiofsd_version(virtiofsd_text)
    lv = f"{libvirt_version // 1_000_000}.{libvirt_version // 1000 % 1000}.{libvirt_version % 1000}"
    shown = ".".join(map(str, version)) or "unknown"
    if libvirt_version < LIBVIRT_RO_VIRTIOFS:
        return False, f"libvirt {lv} has no read-only virtiofs (needs 11.0): read-only bind mount instead"
    if kind != "rust" or version < VIRTIOFSD_RO:
        return False, f"virtiofsd {shown} ({kind}) cannot export read-only (needs 1.13): read-only bind mount"
    return True, f"libvirt {lv} with virtiofsd {shown}: read-only virtiofs share"


# -- readers (thin) ---------------------------------------------------------------------------


def read_hugepage_pools(sys_root: Path = Path("/sys")) -> dict[int, int]:
    pools = {}
    for pool in (sys_root / "kernel/mm/hugepages").glob("hugepages-*kB"):
        try:
            size = int(pool.name.removeprefix("hugepages-").removesuffix("kB"))
            pools[size] = int((pool / "nr_hugepages").read_text())
        except (OSError, ValueError):
            continue
    return pools


def read_node_cpus(sys_root: Path = Path("/sys")) -> dict[int, tuple[int, ...]]:
    out = {}
    for node in (sys_root / "devices/system/node").glob("node[0-9]*"):
        try:
            out[int(node.name[4:])] = parse_cpulist((node / "cpulist").read_text())
        except (OSError, ValueError):
            continue
    return out


def read_virtiofsd_version() -> str:
    for candidate in (*VIRTIOFSD_PATHS, shutil.which("virtiofsd") or ""):
        if candidate and Path(candidate).is_file():
            try:
                done = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=10,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired):
                continue
            return (done.stdout or done.stderr).strip()
    return ""


def plan_tuning(gpus: tuple[str, ...], functions: list, *, hugepages: str, numa: str,
                pools: dict[int, int], node_cpus: dict[int, tuple[int, ...]], readonly: tuple[bool, str]) -> HostTuning:
    """Pure: the HostTuning for a VM with these GPUs, from what the host was read to have.

    `functions` are agent.hw.pci_sysfs.PciFunction (GPUs and NVSwitches). On an HGX board a
    multi-GPU VM must take every GPU and gets the NVSwitches too (full passthrough: the guest's
    fabric manager trains NVLink); any other multi-GPU shape is refused with the reason."""
    if numa not in ("auto", "off"):
        raise InvalidInput(f"numa {numa!r}: expected auto or off")
    by_bdf = {f.bdf: f for f in functions}
    board_gpus = sorted(f.bdf for f in functions if f.is_gpu)
    switches = tuple(sorted(f.bdf for f in functions if f.is_nvswitch))
    nvswitches: tuple[str, ...] = ()
    if switches and len(gpus) > 1:
        if sorted(gpus) != board_gpus:
            raise InvalidInput(
                f"this HGX board has {len(switches)} NVSwitches: a VM gets 1 GPU or all {len(board_gpus)} "
                f"(full passthrough with the NVSwitches), not {len(gpus)}")
        nvswitches = switches
    page_kib, page_note = choose_hugepages(hugepages, pools)
    node, numa_note = (None, "NUMA pinning off (--numa off)") if numa == "off" else choose_numa(
        [by_bdf[g].numa_node for g in gpus if g in by_bdf], node_cpus)
    bars = [by_bdf[b].bars64_mib for b in (*gpus, *nvswitches) if b in by_bdf]
    return HostTuning(
        hugepage_kib=page_kib,
        numa_node=node,
        host_cpus=node_cpus.get(node, ()) if node is not None else (),
        virtiofs_readonly=readonly[0],
        nvswitches=nvswitches,
        mmio64_mib=guest_mmio64_mib(bars) if len(bars) == len(gpus) + len(nvswitches) else 0,
        note="; ".join((page_note, numa_note, readonly[1])),
    )
