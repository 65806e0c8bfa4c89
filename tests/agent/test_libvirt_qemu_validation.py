"""Every domain shape we generate, defined on the real QEMU driver (qemu:///system), which
validates against the installed QEMU's capabilities (test:///default skips that). No domain
with host devices is ever started; each one is undefined at once.

What libvirt 9.0 (Debian 12) checks at define, found here: the schema, QEMU capabilities (a
virtiofs <readonly/> is rejected: "virtiofs does not yet support read-only mode"), duplicate
host devices. What it leaves to start: whether a host PCI device exists or is bound to vfio-pci,
whether the hugepage pool has the pages, whether the numatune node exists on this host.
"""

from __future__ import annotations

import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from agent.vm.base import VmSpec
from agent.vm.domain_xml import QEMU_NS, build_domain_xml, mac_for
from agent.vm.host_tuning import HostTuning, read_virtiofsd_version, readonly_share_supported

REPO = Path(__file__).resolve().parents[2]
GPUS8 = tuple(f"0000:{b:02x}:00.0" for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb))
SWITCHES = tuple(f"0000:{b:02x}:00.0" for b in (0x05, 0x06, 0x07, 0x08))
NUMA = {"numa_node": 0, "host_cpus": (0, 1)}


@pytest.fixture(scope="module")
def conn():
    # setup.sh installs the QEMU driver; without systemd nothing starts libvirtd, so we do.
    up = subprocess.run([str(REPO / "scripts/libvirtd-up.sh")], capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    c = libvirt.open("qemu:///system")
    yield c
    c.close()


def define(conn, tmp_path, name, gpus, tuning):
    spec = VmSpec(replica_id=f"val-{os.getpid()}-{name}", deployment="d", model_name="m",
                  model_source="/srv/models/m", gpus=gpus, gpu_memory_mib=143_771, cpu=4, memory_gib=2)
    xml = build_domain_xml(spec, overlay=tmp_path / "o.qcow2", seed_iso=tmp_path / "s.iso",
                           mac=mac_for(spec.replica_id), bridge="fabric0", models_dir=tmp_path, tuning=tuning)
    dom = conn.defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
    try:
        assert not dom.isActive()
        return ET.fromstring(dom.XMLDesc(0))
    finally:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)


@pytest.mark.parametrize("name, gpus, tuning", [
    ("1gpu", GPUS8[:1], HostTuning()),
    ("1gpu-1g-numa", GPUS8[:1], HostTuning(hugepage_kib=1_048_576, **NUMA)),
    ("2gpu-2m", GPUS8[:2], HostTuning(hugepage_kib=2048)),
    ("2gpu-numa", GPUS8[:2], HostTuning(**NUMA)),
    ("8gpu-hgx", GPUS8, HostTuning(hugepage_kib=1_048_576, nvswitches=SWITCHES, mmio64_mib=8 << 20, **NUMA)),
    ("cpu-only", (), HostTuning()),
])
def test_qemu_driver_accepts_every_variant(conn, tmp_path, name, gpus, tuning):
    root = define(conn, tmp_path, name, gpus, tuning)
    assert len(root.findall("devices/hostdev")) == len(gpus) + len(tuning.nvswitches)
    assert root.find("devices/memballoon").get("model") == "none"
    assert root.find("devices/filesystem/driver").get("type") == "virtiofs"
    assert (root.find("memoryBacking/hugepages") is not None) == bool(tuning.hugepage_kib)
    assert (root.find("numatune/memory") is not None) == (tuning.numa_node is not None)
    assert (root.find("cpu/numa/cell") is not None) == (tuning.numa_node is not None)
    args = [a.get("value") for a in root.findall(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]
    assert bool(args) == bool(gpus)  # the QEMU driver keeps our fw_cfg aperture (test:/// drops it)


def test_readonly_virtiofs_matches_what_the_versions_say(conn, tmp_path):
    supported, why = readonly_share_supported(conn.getLibVersion(), read_virtiofsd_version())
    if supported:
        root = define(conn, tmp_path, "ro", GPUS8[:1], HostTuning(virtiofs_readonly=True))
        assert root.find("devices/filesystem/readonly") is not None
    else:
        assert "bind" in why
        with pytest.raises(libvirt.libvirtError, match="read-only"):
            define(conn, tmp_path, "ro", GPUS8[:1], HostTuning(virtiofs_readonly=True))


def test_duplicate_host_device_is_refused_at_define(conn, tmp_path):
    with pytest.raises(libvirt.libvirtError, match="(?i)hostdev already exists"):
        define(conn, tmp_path, "dup", (GPUS8[0], GPUS8[0]), HostTuning())


def test_more_than_255_vcpus_get_eim_and_a_split_irqchip_that_libvirt_accepts(conn, tmp_path):
    spec = VmSpec(replica_id=f"val-{os.getpid()}-big", deployment="d", model_name="m",
                  model_source="/srv/models/m", gpus=GPUS8, gpu_memory_mib=143_771, cpu=256, memory_gib=4)
    xml = build_domain_xml(spec, overlay=tmp_path / "o.qcow2", seed_iso=tmp_path / "s.iso",
                           mac=mac_for(spec.replica_id), bridge="fabric0", models_dir=tmp_path)
    dom = conn.defineXMLFlags(xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
    try:
        back = ET.fromstring(dom.XMLDesc(0))
    finally:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    assert back.find("vcpu").text == "256"
    assert back.find("features/ioapic").get("driver") == "qemu"
    assert back.find("devices/iommu/driver").get("eim") == "on"
    assert back.find("cpu/topology").attrib == {"sockets": "1", "dies": "1", "cores": "256", "threads": "1"}
    # The same domain without the IOMMU is what libvirt refuses: the check above is libvirt's own.
    root = ET.fromstring(xml)
    devices = root.find("devices")
    devices.remove(devices.find("iommu"))
    with pytest.raises(libvirt.libvirtError, match="(?i)eim|255|extended interrupt"):
        conn.defineXMLFlags(ET.tostring(root, encoding="unicode"), libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
    small = ET.fromstring(build_domain_xml(
        VmSpec(replica_id="s", deployment="d", model_name="m", model_source="/srv/m", cpu=8, memory_gib=1),
        overlay=tmp_path / "o.qcow2", seed_iso=tmp_path / "s.iso", mac=mac_for("s"), bridge="b", models_dir=tmp_path))
    assert small.find("devices/iommu") is None and small.find("features/ioapic") is None
    assert small.find("cpu/topology").get("cores") == "8"
