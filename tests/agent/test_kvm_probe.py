"""agent.hw.kvm: the KVM probe (a real transient guest on qemu:///system), its per-boot cache,
and what the agent does with the verdict: the inventory and heartbeat report it, the libvirt
driver refuses a GPU guest where KVM does not work and never runs one under TCG.

The real probe runs both ways here: under TCG its guest always runs (the "usable" branch of the
probe itself), and under KVM the verdict is whatever this host's KVM does (on a nested KVM that
cannot take the host CPU model it is "not usable" with QEMU's MSR error). The callers' branches
are driven through the probe interface with FakeKvmProbe.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest
from fastapi.testclient import TestClient

from agent.api import create_app
from agent.heartbeat import Heartbeat, HostResources
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.kvm import (
    KERNEL_DONE,
    MARKER,
    PROBE_PREFIX,
    CachedKvmProbe,
    FakeKvmProbe,
    KvmState,
    LibvirtKvmProbe,
    boot_sector,
    probe_domain_xml,
    probe_kernel,
)
from agent.hw.nvml_fake import FakeNvml
from agent.state import AgentState
from agent.vm.base import VmSpec
from agent.vm.dryrun_driver import DryRunDriver
from agent.vm.libvirt_driver import LibvirtDriver
from common.agent_api import NodeReport
from common.errors import InvalidInput, Refused
from controlplane.ops.nodes import merge_report
from lab.rigs.kvm_verdict import choose_domain_type
from lab.rigs.vm_boot import start_libvirtd

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def libvirtd():
    start_libvirtd()


@pytest.fixture
def probe_dir():
    base = Path(f"/var/lib/libvirt/images/fabric-kvm-test-{os.getpid()}")
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _domains() -> list[str]:
    conn = libvirt.open("qemu:///system")
    try:
        return [d.name() for d in conn.listAllDomains()]
    finally:
        conn.close()


# -- the probe guest ------------------------------------------------------------------------------

def test_boot_sector_is_a_bootable_mbr_that_qemu_runs(tmp_path):
    sector = boot_sector()
    assert len(sector) == 512 and sector[-2:] == b"\x55\xaa" and MARKER in sector
    disk = tmp_path / "d.img"
    disk.write_bytes(sector)
    os.truncate(disk, 1 << 20)
    log = tmp_path / "serial.log"
    # QEMU itself, no libvirt: SeaBIOS loads the sector and the guest writes the marker to COM1.
    proc = subprocess.Popen(["qemu-system-x86_64", "-accel", "tcg", "-M", "q35", "-m", "64", "-display", "none",
                             "-nodefaults", "-serial", f"file:{log}", "-drive", f"file={disk},format=raw,if=ide"])
    try:
        from lab.rigs.polling import wait_for

        wait_for(lambda: log.exists() and MARKER in log.read_bytes(), timeout=60, what="the probe marker on COM1")
    finally:
        proc.kill()
        proc.wait()


def _shape(el: ET.Element) -> tuple:
    return el.tag, dict(el.attrib), [_shape(c) for c in el]


def test_probe_domain_uses_the_guests_cpu_element():
    from agent.vm.domain_xml import build_domain_xml

    spec = VmSpec(replica_id="r1", deployment="d", model_name="m", model_source="hf://o/m")
    for domain_type in ("kvm", "qemu"):
        guest = ET.fromstring(build_domain_xml(spec, overlay=Path("/x.qcow2"), seed_iso=Path("/s.iso"),
                                               mac="52:54:00:00:00:01", bridge="br", models_dir=Path("/m"),
                                               domain_type=domain_type))
        probe = ET.fromstring(probe_domain_xml("p", Path("/d.img"), Path("/c.log"), domain_type))
        assert _shape(probe.find("cpu")) == _shape(guest.find("cpu"))
        assert probe.find("os/type").get("machine") == guest.find("os/type").get("machine") == "q35"
        assert probe.get("type") == domain_type
        assert not probe.findtext("name").startswith("fabric-")  # LibvirtDriver.list() never sees it


def test_probe_boots_the_hosts_kernel_with_no_disk(tmp_path):
    kernel = probe_kernel()
    assert kernel is not None, "scripts/setup.sh installs linux-image-amd64: /boot has a kernel"
    xml = ET.fromstring(probe_domain_xml("p", None, Path("/c.log"), "kvm", kernel=Path("/w/vmlinuz")))
    assert xml.findtext("os/kernel") == "/w/vmlinuz" and "console=ttyS0" in xml.findtext("os/cmdline")
    assert xml.find("devices/disk") is None and xml.find("os/boot") is None
    # the running kernel's file wins over a newer one; an empty /boot has none
    (tmp_path / f"vmlinuz-{os.uname().release}").write_bytes(b"k")
    (tmp_path / "vmlinuz-9.9").write_bytes(b"k")
    assert probe_kernel(tmp_path).name == f"vmlinuz-{os.uname().release}"
    (tmp_path / f"vmlinuz-{os.uname().release}").unlink()
    assert probe_kernel(tmp_path).name == "vmlinuz-9.9"
    assert probe_kernel(tmp_path / "nothing") is None


def _leaves_nothing(probe_dir: Path) -> None:
    # this process's probes (named by its pid): another test process may be probing meanwhile
    mine = f"{PROBE_PREFIX}{os.getpid()}_"
    assert not probe_dir.exists()  # its kernel copy or disk, log and directory are gone
    assert not [n for n in _domains() if n.startswith(mine)]
    assert not list(Path("/var/log/libvirt/qemu").glob(f"{mine}*"))


def test_tcg_probe_boots_a_kernel_through_its_init_and_leaves_nothing(libvirtd, probe_dir):
    verdict = LibvirtKvmProbe(work_dir=probe_dir, domain_type="qemu", timeout_s=120).state()
    assert verdict.usable, verdict.reason
    assert "through its init" in verdict.reason and verdict.domain_type == "qemu"
    _leaves_nothing(probe_dir)


def test_probe_without_a_kernel_falls_back_to_the_boot_sector_and_says_so(libvirtd, probe_dir, tmp_path):
    verdict = LibvirtKvmProbe(work_dir=probe_dir, domain_type="qemu", timeout_s=60,
                              boot_dir=tmp_path / "empty-boot").state()
    assert verdict.usable, verdict.reason
    assert "boot sector" in verdict.reason and "only the firmware path" in verdict.reason
    _leaves_nothing(probe_dir)


def test_a_kernel_that_does_not_finish_its_init_in_time_is_not_usable(libvirtd, probe_dir):
    # TCG needs ~8 s for this kernel's init here: in 1 s it cannot have finished
    verdict = LibvirtKvmProbe(work_dir=probe_dir, domain_type="qemu", timeout_s=1).state()
    assert not verdict.usable
    assert "did not finish its init in 1s" in verdict.reason or "printed nothing in 1s" in verdict.reason, verdict.reason
    _leaves_nothing(probe_dir)


def test_kvm_probe_verdict_matches_what_qemu_does_with_the_guests_cpu(libvirtd, probe_dir, capsys):
    # The same kernel and CPU started with QEMU directly under KVM must agree with the verdict; it
    # runs beside the probe (each may wait out its 60 s on a host where KVM hangs).
    kernel = probe_dir.parent / f"fabric-kvm-direct-{os.getpid()}.vmlinuz"
    shutil.copyfile(probe_kernel(), kernel)
    log = kernel.with_suffix(".log")
    try:
        direct = subprocess.Popen(["timeout", "60", "qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-M", "q35",
                                   "-m", "256", "-display", "none", "-nodefaults", "-serial", f"file:{log}",
                                   "-kernel", str(kernel), "-append", "console=ttyS0 panic=-1", "-no-reboot"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            verdict = LibvirtKvmProbe(work_dir=probe_dir, timeout_s=60).state()
        finally:
            _, stderr = direct.communicate(timeout=90)
        assert verdict.domain_type == "kvm" and verdict.reason
        with capsys.disabled():
            print(f"\n[kvm] this host: usable={verdict.usable}: {verdict.reason}")
        ran = log.exists() and KERNEL_DONE in log.read_bytes()
        assert ran == verdict.usable, (verdict.reason, stderr)
        if not verdict.usable and "MSR" in stderr:
            assert "failed to set MSR" in verdict.reason  # QEMU's own words reach the operator
    finally:
        kernel.unlink(missing_ok=True)
        log.unlink(missing_ok=True)


def test_probe_without_dev_kvm_or_libvirt_says_why(tmp_path):
    missing = LibvirtKvmProbe(work_dir=tmp_path, dev_kvm=tmp_path / "kvm").state()
    assert not missing.usable and "no " in missing.reason and "kvm" in missing.reason
    unreachable = LibvirtKvmProbe("qemu+unix:///system?socket=/nonexistent", work_dir=tmp_path / "w",
                                  dev_kvm=Path("/dev/null")).state()
    assert not unreachable.usable and "could not run" in unreachable.reason


# -- the per-boot cache -----------------------------------------------------------------------------

def test_cache_probes_once_per_boot_and_key(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    inner = FakeKvmProbe(False, "MSR 0x10a")
    cache = tmp_path / "kvm.json"
    first = CachedKvmProbe(inner, cache, key="qemu:///system", boot_id_file=boot)
    assert first.state() == first.state() and inner.calls == 1
    # another process (a new object) on the same boot reads the file
    again = CachedKvmProbe(inner, cache, key="qemu:///system", boot_id_file=boot).state()
    assert inner.calls == 1 and again.reason == "MSR 0x10a" and not again.usable
    assert json.loads(cache.read_text())["boot_id"] == "boot-1"
    CachedKvmProbe(inner, cache, key="qemu+ssh://other/system", boot_id_file=boot).state()
    assert inner.calls == 2  # another hypervisor URI is another verdict
    boot.write_text("boot-2\n")
    CachedKvmProbe(inner, cache, key="qemu+ssh://other/system", boot_id_file=boot).state()
    assert inner.calls == 3  # a reboot probes again
    first.forget()
    assert not cache.exists()
    cache.write_text("{not json")
    assert CachedKvmProbe(inner, cache, boot_id_file=boot).state().reason == "MSR 0x10a" and inner.calls == 4


# -- the tests' choice -------------------------------------------------------------------------------

def test_tests_use_tcg_and_say_why_when_kvm_does_not_work(capsys):
    assert choose_domain_type(FakeKvmProbe(True, "ran"))[0] == "kvm"
    assert capsys.readouterr().err == ""
    domain_type, verdict = choose_domain_type(FakeKvmProbe(False, "failed to set MSR 0x10a"))
    assert domain_type == "qemu" and not verdict.usable
    said = capsys.readouterr().err
    assert "using TCG" in said and "failed to set MSR 0x10a" in said


# -- the driver's refusal -----------------------------------------------------------------------------

def _spec(gpus=("0000:3b:00.0",)) -> VmSpec:
    return VmSpec(replica_id="kvm-r1", deployment="d", model_name="m", model_source="hf://o/m", gpus=gpus,
                  gpu_memory_mib=81_559, cpu=2, memory_gib=4)


def _driver(tmp_path, probe, domain_type="kvm") -> LibvirtDriver:
    golden = tmp_path / "golden.qcow2"
    golden.write_bytes(b"")
    return LibvirtDriver("test:///default", image=golden, state_dir=tmp_path / "vms", models_dir=tmp_path / "models",
                         sysfs_root=tmp_path / "sys", domain_type=domain_type, kvm=probe)


def test_gpu_vm_is_refused_where_kvm_does_not_work_and_nothing_is_made(tmp_path):
    probe = FakeKvmProbe(False, "QEMU could not start a kvm guest: failed to set MSR 0x10a")
    driver = _driver(tmp_path, probe)
    with pytest.raises(Refused) as err:
        driver.create(_spec())
    message = str(err.value)
    assert "KVM does not work on this host" in message and "never runs under TCG" in message
    assert "failed to set MSR 0x10a" in message
    assert driver.get("kvm-r1") is None
    assert not (tmp_path / "vms").exists() or not any((tmp_path / "vms").rglob("*.qcow2"))
    # auto does not change that for a GPU guest
    with pytest.raises(Refused, match="never runs under TCG"):
        _driver(tmp_path, probe, "auto").create(_spec())


def test_gpu_vm_is_refused_on_a_tcg_driver(tmp_path):
    with pytest.raises(Refused, match="never runs under TCG"):
        _driver(tmp_path, None, "qemu").create(_spec())


def test_gpu_less_guest_is_tcg_only_with_auto(tmp_path):
    broken = FakeKvmProbe(False, "emulation failure")
    with pytest.raises(Refused, match="--domain-type auto"):
        _driver(tmp_path, broken).accelerator(_spec(gpus=()))
    xml = ET.fromstring(_driver(tmp_path, broken, "auto").domain_xml(_spec(gpus=())))
    assert xml.get("type") == "qemu" and xml.find("cpu").get("mode") == "maximum"
    working = FakeKvmProbe(True)
    assert _driver(tmp_path, working, "auto").accelerator(_spec(gpus=())) == "kvm"
    assert _driver(tmp_path, working).accelerator(_spec()) == "kvm"
    with pytest.raises(InvalidInput):
        _driver(tmp_path, None, "auto")
    with pytest.raises(InvalidInput):
        _driver(tmp_path, working, "xen")


# -- inventory and heartbeat ------------------------------------------------------------------------------

def _state(tmp_path, probe) -> AgentState:
    return AgentState(node_id="n1", vm_driver=DryRunDriver(tmp_path / "dry"),
                      inventory=NvmlInventory(nvml_module=FakeNvml(gpus=[])), kvm=probe)


def test_inventory_health_and_heartbeat_report_kvm(tmp_path):
    probe = FakeKvmProbe(False, "failed to set MSR 0x10a")
    state = _state(tmp_path, probe)
    with TestClient(create_app(state)) as c:
        gpus = c.get("/v1/gpus").json()
        assert gpus["kvm"]["usable"] is False and gpus["kvm"]["reason"] == "failed to set MSR 0x10a"
        assert "KVM not usable: failed to set MSR 0x10a" in c.get("/v1/health").json()["message"]
    beat = Heartbeat(state, client=None, address="https://10.0.0.1:7443",
                     resources=lambda: HostResources(8, 32.0))
    report = beat.report()
    assert report.kvm is not None and report.kvm.usable is False
    wire = NodeReport.model_validate(json.loads(report.model_dump_json()))
    node = merge_report(None, wire, now=5.0)  # fabricd keeps it on the node record
    assert node.kvm.usable is False and node.kvm.reason == "failed to set MSR 0x10a"


def test_a_node_without_a_probe_reports_no_kvm_verdict(tmp_path):
    report = Heartbeat(_state(tmp_path, None), client=None, address="https://10.0.0.1:7443",
                       resources=lambda: HostResources(8, 32.0)).report()
    assert report.kvm is None
    assert KvmState(True, "x").usable  # the dataclass the probes return
