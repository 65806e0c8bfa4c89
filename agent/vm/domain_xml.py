"""libvirt domain XML for one GPU replica: a pure function of the spec, host paths and the
host's tuning (agent.vm.host_tuning).

Choices (docs/gpu-hosts.md says why in more words):
- q35 + UEFI (OVMF pflash, per-VM NVRAM from the vars template): large-BAR GPUs need a
  PCIe topology and 64-bit MMIO, which SeaBIOS/i440fx do not give.
- host-passthrough CPU with <maxphysaddr mode='passthrough'/>: the guest sees the host's
  physical address bits, so a 64-bit MMIO window of hundreds of GiB fits. A topology of one
  socket with one core per vCPU. Above 255 vCPUs (x2APIC ids past 8 bits) the guest gets a
  virtual Intel IOMMU with interrupt remapping and EIM, and a split irqchip (<ioapic
  driver='qemu'/>): libvirt refuses more vCPUs without them.
- one pcie-root-port per passed-through function (GPUs, then an HGX board's NVSwitches), the
  device at function 0 behind it. managed='no': the agent binds/releases through
  agent.hw.vfio (with its refusals), libvirt must not.
- 64-bit MMIO window via `-fw_cfg opt/ovmf/X-PciMmio64Mb`: OVMF sizes its aperture from
  this; q35's <pcihole64> only moves QEMU's hole and OVMF ignores it for placement. Sized
  from the BAR sizes sysfs reports when known, else estimated from GPU memory.
- NUMA: with a node chosen, every vCPU is pinned (cputune, round-robin over the node's CPUs,
  the emulator threads on the node), memory is bound there (numatune strict) and the guest
  gets one NUMA cell (so the guest kernel and NCCL see a real topology).
- memory: memfd backing, with hugetlb pages of the chosen size when the host has them;
  shared access (virtiofsd maps guest RAM); no balloon (VFIO pins all RAM, a balloon
  could only lie about it).
- virtiofs share of the model directory, tag "models"; <readonly/> only where libvirt and
  virtiofsd support it, otherwise the source is a read-only bind mount and the guest mounts ro.
  The model's LoRA adapters (an adapter set, agent.models.adapter_sets) are a second share the
  same way, tag "adapters".
- a tap NIC (created by agent.net.bridge on the fabric bridge, managed='no') with the
  replica's MAC; the cidata seed as a read-only SATA cdrom.
- GPU-less proof variant (scripts/vm-boot-check): `boot=DirectBoot(...)` boots a kernel and
  initramfs directly (no OVMF, no NVRAM; SeaBIOS hands over to the kernel) and
  `domain_type='qemu'` (TCG) replaces the host-passthrough CPU, which TCG cannot provide, with
  `<cpu mode='maximum'>`. Production keeps kvm + OVMF.
"""

from __future__ import annotations

import hashlib
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from agent.hw.kvm import add_cpu
from agent.vm.base import VmSpec
from agent.vm.host_tuning import HostTuning
from agent.vm.mmio import mmio64_mib
from common.errors import InvalidInput

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
FABRIC_NS = "https://fabric.invalid/xmlns/replica/1"

ET.register_namespace("qemu", QEMU_NS)
ET.register_namespace("fabric", FABRIC_NS)


@dataclass(frozen=True)
class Firmware:
    loader: Path = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
    vars_template: Path = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
    nvram: Path | None = None  # per-VM copy; libvirt creates it from the template


@dataclass(frozen=True)
class DirectBoot:
    """Boot this kernel and initramfs directly instead of the firmware and the disk's loader."""

    kernel: Path
    initrd: Path
    cmdline: str = ""


MAX_XAPIC_VCPUS = 255  # above this a q35 guest needs a virtual IOMMU with EIM and a split irqchip


def domain_name(replica_id: str) -> str:
    return f"fabric-{replica_id}"


HOSTNAME_MAX = 63  # one DNS label (RFC 1123); the kernel takes 64, cloud-init and DNS 63


def guest_hostname(replica_id: str) -> str:
    """The guest's hostname: the domain name where it is a valid DNS label, else one made valid
    ('.' and '_' become '-') and, when too long, cut with a hash of the id so two stay distinct."""
    name = re.sub(r"[^a-z0-9-]", "-", domain_name(replica_id).lower()).strip("-")
    if len(name) <= HOSTNAME_MAX and name == domain_name(replica_id):
        return name
    digest = hashlib.sha256(replica_id.encode()).hexdigest()[:8]
    return f"{name[:HOSTNAME_MAX - 9].rstrip('-')}-{digest}"


def mac_for(replica_id: str) -> str:
    """Deterministic, locally administered (52:54:00 is QEMU's) MAC for a replica."""
    digest = hashlib.sha256(replica_id.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def tap_name(replica_id: str) -> str:
    # IFNAMSIZ is 16 with the NUL; a hash keeps long replica ids unique and short.
    return "fabt" + hashlib.sha256(replica_id.encode()).hexdigest()[:10]


def parse_bdf(bdf: str) -> tuple[int, int, int, int]:
    try:
        domain, bus, rest = bdf.split(":")
        slot, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16)
    except ValueError:
        raise InvalidInput(f"gpus: {bdf!r} is not a PCI address like 0000:3b:00.0") from None


def build_domain_xml(
    spec: VmSpec,
    *,
    overlay: Path,
    seed_iso: Path,
    mac: str,
    bridge: str,
    models_dir: Path,
    firmware: Firmware = Firmware(),
    tuning: HostTuning = HostTuning(),
    tap: str | None = None,
    domain_type: str = "kvm",
    console_log: Path | None = None,
    boot: DirectBoot | None = None,
    adapters_dir: Path | None = None,
) -> str:
    """``adapters_dir``: the host directory shared read-only as tag "adapters" (the guest mounts
    it at /adapters: the model's LoRA adapters), beside the model share."""
    if domain_type not in ("kvm", "qemu"):
        raise InvalidInput(f"domain_type {domain_type!r}: expected kvm or qemu (TCG)")
    if boot is not None and "\n" in boot.cmdline:
        raise InvalidInput("kernel command line: no newlines")
    if spec.cpu < 1 or spec.memory_gib <= 0:
        raise InvalidInput("cpu and memory_gib must be positive")
    bdfs = [parse_bdf(g) for g in spec.gpus]
    switches = [parse_bdf(s) for s in tuning.nvswitches]
    dom = ET.Element("domain", {"type": domain_type})
    _sub(dom, "name", text=domain_name(spec.replica_id))
    meta = _sub(_sub(dom, "metadata"), f"{{{FABRIC_NS}}}replica")
    for key, value in (
        ("id", spec.replica_id),
        ("deployment", spec.deployment),
        ("model", spec.model_name),
        ("bridge", bridge),
        ("port", str(spec.port)),
    ):
        _sub(meta, f"{{{FABRIC_NS}}}{key}", text=value)

    _sub(dom, "memory", {"unit": "KiB"}, text=str(int(spec.memory_gib * 1024 * 1024)))
    _sub(dom, "vcpu", {"placement": "static"}, text=str(spec.cpu))
    _numa_pinning(dom, spec, tuning)
    backing = _sub(dom, "memoryBacking")
    if tuning.hugepage_kib:
        pages = _sub(backing, "hugepages")
        _sub(pages, "page", {"size": str(tuning.hugepage_kib), "unit": "KiB"})
    _sub(backing, "source", {"type": "memfd"})  # hugetlb-backed memfd when pages are set
    _sub(backing, "access", {"mode": "shared"})  # virtiofsd maps guest memory
    if tuning.hugepage_kib:
        _sub(backing, "locked")  # VFIO pins guest memory anyway; locked keeps it out of swap accounting

    os_el = _sub(dom, "os")
    _sub(os_el, "type", {"arch": "x86_64", "machine": "q35"}, text="hvm")
    if boot is not None:
        _sub(os_el, "kernel", text=str(boot.kernel))
        _sub(os_el, "initrd", text=str(boot.initrd))
        _sub(os_el, "cmdline", text=boot.cmdline)
    else:
        _sub(os_el, "loader", {"readonly": "yes", "secure": "no", "type": "pflash"}, text=str(firmware.loader))
        nvram = firmware.nvram or overlay.with_name(f"{domain_name(spec.replica_id)}_VARS.fd")
        _sub(os_el, "nvram", {"template": str(firmware.vars_template)}, text=str(nvram))
        _sub(os_el, "boot", {"dev": "hd"})

    features = _sub(dom, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    if spec.cpu > MAX_XAPIC_VCPUS:  # x2APIC ids above 255 need interrupt remapping: split irqchip + EIM
        _sub(features, "ioapic", {"driver": "qemu"})
    cpu = add_cpu(dom, domain_type, spec.cpu)
    if tuning.numa_node is not None:
        cells = _sub(cpu, "numa")
        last = spec.cpu - 1
        _sub(cells, "cell", {"id": "0", "cpus": f"0-{last}" if last else "0",
                             "memory": str(int(spec.memory_gib * 1024 * 1024)), "unit": "KiB",
                             "memAccess": "shared"})
    _sub(dom, "clock", {"offset": "utc"})
    _sub(dom, "on_poweroff", text="destroy")
    _sub(dom, "on_reboot", text="restart")
    _sub(dom, "on_crash", text="destroy")

    dev = _sub(dom, "devices")
    disk = _sub(dev, "disk", {"type": "file", "device": "disk"})
    _sub(disk, "driver", {"name": "qemu", "type": "qcow2", "discard": "unmap"})
    _sub(disk, "source", {"file": str(overlay)})
    _sub(disk, "target", {"dev": "vda", "bus": "virtio"})

    cdrom = _sub(dev, "disk", {"type": "file", "device": "cdrom"})
    _sub(cdrom, "driver", {"name": "qemu", "type": "raw"})
    _sub(cdrom, "source", {"file": str(seed_iso)})
    _sub(cdrom, "target", {"dev": "sda", "bus": "sata"})
    _sub(cdrom, "readonly")

    _share(dev, models_dir, "models", tuning.virtiofs_readonly)
    if adapters_dir is not None:
        _share(dev, adapters_dir, "adapters", tuning.virtiofs_readonly)

    nic = _sub(dev, "interface", {"type": "ethernet"})
    _sub(nic, "mac", {"address": mac})
    _sub(nic, "target", {"dev": tap or tap_name(spec.replica_id), "managed": "no"})
    _sub(nic, "model", {"type": "virtio"})

    for i, (domain, bus, slot, function) in enumerate(bdfs + switches):
        port_index = i + 1  # pcie-root is index 0; each GPU gets its own root port and bus
        _sub(dev, "controller", {"type": "pci", "index": str(port_index), "model": "pcie-root-port"})
        host = _sub(dev, "hostdev", {"mode": "subsystem", "type": "pci", "managed": "no"})
        _sub(
            _sub(host, "source"),
            "address",
            {
                "domain": f"0x{domain:04x}",
                "bus": f"0x{bus:02x}",
                "slot": f"0x{slot:02x}",
                "function": f"0x{function:x}",
            },
        )
        _sub(
            host,
            "address",
            {
                "type": "pci",
                "domain": "0x0000",
                "bus": f"0x{port_index:02x}",
                "slot": "0x00",
                "function": "0x0",
            },
        )

    channel = _sub(dev, "channel", {"type": "unix"})  # qemu-guest-agent: how we learn the guest IP
    _sub(channel, "target", {"type": "virtio", "name": "org.qemu.guest_agent.0"})
    serial = _sub(dev, "serial", {"type": "pty"})
    if console_log is not None:  # libvirt copies the serial console here: the replica's engine log
        _sub(serial, "log", {"file": str(console_log), "append": "on"})
    _sub(dev, "console", {"type": "pty"})
    _sub(dev, "memballoon", {"model": "none"})
    if spec.cpu > MAX_XAPIC_VCPUS:
        iommu = _sub(dev, "iommu", {"model": "intel"})
        # caching_mode: required with assigned (VFIO) devices behind a virtual IOMMU
        _sub(iommu, "driver", {"intremap": "on", "eim": "on", "caching_mode": "on"})

    window = tuning.mmio64_mib or mmio64_mib(len(bdfs), spec.gpu_memory_mib)
    if window:
        cmdline = _sub(dom, f"{{{QEMU_NS}}}commandline")
        _sub(cmdline, f"{{{QEMU_NS}}}arg", {"value": "-fw_cfg"})
        _sub(cmdline, f"{{{QEMU_NS}}}arg", {"value": f"name=opt/ovmf/X-PciMmio64Mb,string={window}"})

    ET.indent(dom, space="  ")
    return ET.tostring(dom, encoding="unicode") + "\n"


def _share(dev: ET.Element, source: Path, tag: str, readonly: bool) -> None:
    """A virtiofs share of a host directory under ``tag`` (the guest mounts it read-only)."""
    share = _sub(dev, "filesystem", {"type": "mount", "accessmode": "passthrough"})
    _sub(share, "driver", {"type": "virtiofs"})
    _sub(share, "source", {"dir": str(source)})
    _sub(share, "target", {"dir": tag})
    if readonly:
        _sub(share, "readonly")


def _numa_pinning(dom: ET.Element, spec: VmSpec, tuning: HostTuning) -> None:
    if tuning.numa_node is None or not tuning.host_cpus:
        return
    tune = _sub(dom, "cputune")
    for vcpu in range(spec.cpu):
        _sub(tune, "vcpupin", {"vcpu": str(vcpu), "cpuset": str(tuning.host_cpus[vcpu % len(tuning.host_cpus)])})
    _sub(tune, "emulatorpin", {"cpuset": _cpuset(tuning.host_cpus)})
    numatune = _sub(dom, "numatune")
    _sub(numatune, "memory", {"mode": "strict", "nodeset": str(tuning.numa_node)})


def _cpuset(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> '0-2,5'."""
    parts, ordered = [], sorted(set(cpus))
    start = prev = ordered[0]
    for cpu in ordered[1:] + [None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


def _sub(
    parent: ET.Element, tag: str, attrs: dict[str, str] | None = None, text: str | None = None
) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs or {})
    if text is not None:
        el.text = text
    return el
