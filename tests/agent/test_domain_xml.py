"""Structure of the libvirt domain XML, plus golden files for two representative replicas.

Regenerate the golden files after an intended change with FABRIC_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from agent.vm.base import VmSpec
from agent.vm.domain_xml import (
    QEMU_NS,
    DirectBoot,
    Firmware,
    build_domain_xml,
    mac_for,
    tap_name,
)
from agent.vm.host_tuning import HostTuning
from agent.vm.mmio import mmio64_mib

# A tuned host: 1 GiB pages, the GPUs on NUMA node 1 (CPUs 16-31), a read-only virtiofs share.
TUNED = HostTuning(hugepage_kib=1_048_576, numa_node=1, host_cpus=tuple(range(16, 32)), virtiofs_readonly=True)
from common.errors import InvalidInput

GOLDEN = Path(__file__).parent / "golden"
STATE = Path("/var/lib/fabric/vms")


def two_h100() -> VmSpec:
    return VmSpec(
        replica_id="llama-r1",
        deployment="llama",
        model_name="llama-3.1-70b",
        model_source="hf://meta-llama/Llama-3.1-70B",
        gpus=("0000:3b:00.0", "0000:c1:00.0"),
        gpu_memory_mib=81_559,
        cpu=16,
        memory_gib=128,
    )


def one_h200() -> VmSpec:
    return VmSpec(
        replica_id="qwen-r7",
        deployment="qwen",
        model_name="qwen",
        model_source="/srv/models/qwen",
        gpus=("0000:3b:00.0",),
        gpu_memory_mib=143_771,
        cpu=8,
        memory_gib=64,
    )


def render(spec: VmSpec, hugepages: bool) -> str:
    name = f"fabric-{spec.replica_id}"
    return build_domain_xml(
        spec,
        overlay=STATE / f"{name}.qcow2",
        seed_iso=STATE / f"{name}-seed.iso",
        mac=mac_for(spec.replica_id),
        bridge="fabric0",
        models_dir=Path("/srv/models"),
        firmware=Firmware(),
        tuning=TUNED if hugepages else HostTuning(),
    )


@pytest.mark.parametrize(
    "spec,hugepages,golden",
    [
        (two_h100(), True, "domain_2xh100_hugepages.xml"),
        (one_h200(), False, "domain_1xh200.xml"),
    ],
)
def test_golden(spec, hugepages, golden):
    xml = render(spec, hugepages)
    path = GOLDEN / golden
    if os.environ.get("FABRIC_UPDATE_GOLDEN") == "1":
        path.write_text(xml)
    assert xml == path.read_text()


def test_structure_of_a_two_gpu_domain():
    root = ET.fromstring(render(two_h100(), hugepages=True))
    assert root.find("name").text == "fabric-llama-r1"
    assert root.find("os/type").get("machine") == "q35"
    loader = root.find("os/loader")
    assert loader.get("type") == "pflash" and "OVMF" in loader.text
    assert root.find("os/nvram").text == str(STATE / "fabric-llama-r1_VARS.fd")
    cpu = root.find("cpu")
    assert cpu.get("mode") == "host-passthrough"
    assert cpu.find("maxphysaddr").get("mode") == "passthrough"
    assert root.find("memoryBacking/hugepages/page").get("size") == "1048576"
    assert root.find("memoryBacking/locked") is not None
    assert root.find("memoryBacking/source").get("type") == "memfd"
    pins = root.findall("cputune/vcpupin")
    assert [p.get("cpuset") for p in pins] == [str(c) for c in range(16, 32)]
    assert root.find("cputune/emulatorpin").get("cpuset") == "16-31"
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "1"}
    cell = root.find("cpu/numa/cell")
    assert cell.get("cpus") == "0-15" and cell.get("memAccess") == "shared"
    assert root.find("devices/memballoon").get("model") == "none"
    assert root.find("memory").text == str(128 * 1024 * 1024)

    ports = [c for c in root.findall("devices/controller") if c.get("model") == "pcie-root-port"]
    hostdevs = root.findall("devices/hostdev")
    assert len(ports) == len(hostdevs) == 2
    port_buses = {int(p.get("index")) for p in ports}
    for hostdev, (bus, host_bus) in zip(hostdevs, [(1, "0x3b"), (2, "0xc1")], strict=True):
        assert hostdev.get("managed") == "no" and hostdev.get("type") == "pci"
        assert hostdev.find("source/address").get("bus") == host_bus
        guest_bus = int(hostdev.find("address").get("bus"), 16)
        assert guest_bus == bus and guest_bus in port_buses  # each GPU sits behind its own root port

    disk = root.find("devices/disk[@device='disk']")
    assert disk.find("driver").get("type") == "qcow2"
    assert disk.find("source").get("file").endswith("fabric-llama-r1.qcow2")
    cdrom = root.find("devices/disk[@device='cdrom']")
    assert cdrom.find("readonly") is not None and cdrom.find("source").get("file").endswith("-seed.iso")

    share = root.find("devices/filesystem")
    assert share.find("driver").get("type") == "virtiofs"
    assert share.find("readonly") is not None
    assert share.find("target").get("dir") == "models"
    assert root.find("memoryBacking/access").get("mode") == "shared"  # virtiofs needs it

    nic = root.find("devices/interface")
    assert nic.get("type") == "ethernet"
    assert nic.find("mac").get("address") == mac_for("llama-r1")
    assert nic.find("target").get("dev") == tap_name("llama-r1")
    assert nic.find("target").get("managed") == "no"

    args = [a.get("value") for a in root.findall(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]
    assert args == ["-fw_cfg", f"name=opt/ovmf/X-PciMmio64Mb,string={mmio64_mib(2, 81_559)}"]


def test_no_gpus_no_mmio_window_and_memfd_backing():
    spec = VmSpec(replica_id="cpu-only", deployment="d", model_name="m", model_source="/srv/models/m")
    root = ET.fromstring(render(spec, hugepages=False))
    assert root.findall("devices/hostdev") == []
    assert root.find(f"{{{QEMU_NS}}}commandline") is None
    assert root.find("memoryBacking/source").get("type") == "memfd"
    assert root.find("memoryBacking/locked") is None
    assert root.find("memoryBacking/hugepages") is None
    assert root.find("cputune") is None and root.find("numatune") is None and root.find("cpu/numa") is None
    assert root.find("devices/filesystem/readonly") is None  # no read-only virtiofs here: a ro bind instead


def test_mmio_window_covers_large_bars():
    # H100 80 GiB exposes a 128 GiB BAR1; H200 141 GiB a 256 GiB one.
    assert mmio64_mib(1, 81_559) >= 128 * 1024
    assert mmio64_mib(1, 143_771) >= 256 * 1024
    assert mmio64_mib(8, 143_771) >= 8 * 256 * 1024
    assert mmio64_mib(0, 81_559) == 0


def test_mac_is_deterministic_and_locally_administered():
    mac = mac_for("llama-r1")
    assert mac == mac_for("llama-r1") and mac != mac_for("llama-r2")
    first = int(mac.split(":")[0], 16)
    assert mac.startswith("52:54:00:") and first & 0x02 and not first & 0x01
    assert len(tap_name("a-very-long-replica-identifier-0123456789")) <= 15


def test_bad_pci_address_is_invalid_input():
    spec = VmSpec(replica_id="r", deployment="d", model_name="m", model_source="/m", gpus=("3b:00",))
    with pytest.raises(InvalidInput, match="3b:00"):
        render(spec, hugepages=False)


def test_hgx_full_passthrough_puts_nvswitches_behind_their_own_root_ports():
    gpus = tuple(f"0000:{b:02x}:00.0" for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb))
    switches = tuple(f"0000:{b:02x}:00.0" for b in (0x05, 0x06, 0x07, 0x08))
    spec = VmSpec(replica_id="hgx", deployment="d", model_name="m", model_source="/srv/models/m", gpus=gpus,
                  gpu_memory_mib=143_771, cpu=8, memory_gib=64)
    xml = build_domain_xml(spec, overlay=STATE / "o.qcow2", seed_iso=STATE / "s.iso", mac=mac_for("hgx"),
                           bridge="fabric0", models_dir=Path("/srv/models"),
                           tuning=HostTuning(nvswitches=switches, mmio64_mib=8 << 20))
    root = ET.fromstring(xml)
    sources = [h.find("source/address") for h in root.findall("devices/hostdev")]
    assert len(sources) == 12
    assert [f"0000:{int(a.get('bus'), 16):02x}:00.0" for a in sources[8:]] == list(switches)
    buses = [int(h.find("address").get("bus"), 16) for h in root.findall("devices/hostdev")]
    assert buses == list(range(1, 13))
    args = [a.get("value") for a in root.findall(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]
    assert args[1] == f"name=opt/ovmf/X-PciMmio64Mb,string={8 << 20}"  # sized from sysfs BARs


def test_serial_console_is_logged_to_the_replica_log_when_asked():
    assert ET.fromstring(render(one_h200(), hugepages=False)).find("devices/serial/log") is None
    xml = build_domain_xml(one_h200(), overlay=STATE / "o.qcow2", seed_iso=STATE / "s.iso", mac=mac_for("x"),
                           bridge="fabric0", models_dir=Path("/srv/models"), console_log=STATE / "console" / "x.log")
    log = ET.fromstring(xml).find("devices/serial/log")
    assert (log.get("file"), log.get("append")) == (str(STATE / "console" / "x.log"), "on")


def test_direct_kernel_boot_on_tcg_has_no_firmware_and_no_host_cpu():
    """The GPU-less boot proof's variant (scripts/vm-boot-check): kernel + initramfs, TCG."""
    spec = VmSpec(replica_id="boot", deployment="d", model_name="m", model_source="/srv/models/m")
    boot = DirectBoot(Path("/img/vmlinuz"), Path("/img/initrd.img"), "console=ttyS0 root=/dev/vda")
    root = ET.fromstring(build_domain_xml(spec, overlay=STATE / "o.qcow2", seed_iso=STATE / "s.iso",
                                          mac=mac_for("boot"), bridge="br", models_dir=Path("/m"),
                                          domain_type="qemu", boot=boot))
    assert root.get("type") == "qemu"
    assert (root.findtext("os/kernel"), root.findtext("os/initrd"), root.findtext("os/cmdline")) == (
        "/img/vmlinuz", "/img/initrd.img", "console=ttyS0 root=/dev/vda")
    assert root.find("os/loader") is None and root.find("os/nvram") is None and root.find("os/boot") is None
    assert root.find("cpu").get("mode") == "maximum" and root.find("cpu/maxphysaddr") is None
    # Everything else is the production shape: seed cdrom, virtiofs share, tap NIC, no balloon.
    assert root.find("devices/filesystem/driver").get("type") == "virtiofs"
    assert root.find("devices/disk[@device='cdrom']/source").get("file") == str(STATE / "s.iso")
    assert root.find("devices/interface").get("type") == "ethernet"


def test_kvm_default_keeps_ovmf_and_host_passthrough():
    spec = VmSpec(replica_id="boot", deployment="d", model_name="m", model_source="/srv/models/m")
    root = ET.fromstring(render(spec, hugepages=False))
    assert root.get("type") == "kvm" and root.find("os/kernel") is None
    assert root.find("os/loader").get("type") == "pflash"
    assert root.find("cpu").get("mode") == "host-passthrough" and root.find("cpu/maxphysaddr") is not None


@pytest.mark.parametrize("kwargs", [{"domain_type": "xen"},
                                    {"boot": DirectBoot(Path("/k"), Path("/i"), "a\nb")}])
def test_bad_virt_type_or_cmdline_is_invalid_input(kwargs):
    spec = VmSpec(replica_id="boot", deployment="d", model_name="m", model_source="/srv/models/m")
    with pytest.raises(InvalidInput):
        build_domain_xml(spec, overlay=STATE / "o.qcow2", seed_iso=STATE / "s.iso", mac=mac_for("boot"),
                         bridge="br", models_dir=Path("/m"), **kwargs)


def test_guest_hostname_is_a_label_the_kernel_and_dns_take():
    import re
    import subprocess

    from agent.vm.domain_xml import guest_hostname

    longest = "a" * 63  # the longest replica id: "fabric-" + 63 characters is 70
    names = {rid: guest_hostname(rid) for rid in ("r1", longest, "a" * 62 + "b", "dep_1.r2", "x" * 57)}
    assert names["r1"] == "fabric-r1" and names["dep_1.r2"].startswith("fabric-dep-1-r2-")
    assert len(names["x" * 57]) <= 63 and len(names[longest]) <= 63
    assert names[longest] != names["a" * 62 + "b"]  # cut names stay distinct
    label = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    for rid, name in names.items():
        assert label.match(name), (rid, name)
        # the kernel's own check: sethostname(2) in a fresh UTS namespace
        done = subprocess.run(["unshare", "--uts", "sh", "-c", f"hostname {name} && hostname"],
                              capture_output=True, text=True, timeout=10)
        assert done.returncode == 0 and done.stdout.strip() == name, done.stderr
    too_long = "fabric-" + longest
    refused = subprocess.run(["unshare", "--uts", "hostname", too_long], capture_output=True, text=True, timeout=10)
    assert refused.returncode != 0  # what the old hostname (the domain name) did on a 63-character id
