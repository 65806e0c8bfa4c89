"""A real guest booted through our LibvirtDriver on qemu:///system, bounded for `make test`.

The guest (lab/rigs/tiny_guest.py: the host's Debian kernel, a busybox initramfs, an ext4
root with python3 and the engine simulator as /opt/vllm/bin/vllm) is built here from installed
packages; the driver makes the overlay, our cloud-init seed, the tap on an isolated libvirt
network, and the domain (direct kernel boot; KVM where agent.hw.kvm's probe booted this same
kernel through its init here, else TCG, and the test prints why: lab/rigs/kvm_verdict.py). Bounded to fit `make test`: it waits until the guest kernel has
loaded the drivers for our devices and mounted the overlay as root (~20-30 s of TCG here), then
delete and the network's removal must leave nothing. A second boot gives the engine a flag value
its parser refuses and reads the refusal back from the engine log the agent serves (the unit's
output reaches the serial console). The rest of the boot (our seed read from
the cidata cdrom, DHCP on the tap's network, the units written, the virtiofs share mounted
read-only, the engine unit started as `vllm`, /health answered on the tap address) takes 1.5-2
minutes of TCG on 2 shared cores and is checked by scripts/vm-boot-check with the same
vm_boot.seed_findings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import shutil
import stat
import subprocess

import libvirt
import pytest

from agent.vm.domain_xml import domain_name
from agent.vm.engine_log import read_chunk
from lab.rigs import tiny_guest, vm_boot
from lab.rigs.kvm_verdict import choose_domain_type, host_probe


def test_module_order_puts_dependencies_first_and_skips_builtins(tmp_path):
    (tmp_path / "modules.dep").write_text(
        "kernel/a/virtio_ring.ko:\n"
        "kernel/a/virtio.ko: kernel/a/virtio_ring.ko\n"
        "kernel/b/virtio_pci.ko: kernel/a/virtio.ko kernel/a/virtio_ring.ko\n"
        "kernel/c/isofs.ko: kernel/c/cdrom.ko\n"
        "kernel/c/cdrom.ko:\n")
    (tmp_path / "modules.builtin").write_text("kernel/fs/ext4/ext4.ko\n")
    assert tiny_guest.module_order(tmp_path, ("ext4", "virtio_pci", "isofs")) == [
        "kernel/a/virtio_ring.ko", "kernel/a/virtio.ko", "kernel/b/virtio_pci.ko", "kernel/c/cdrom.ko",
        "kernel/c/isofs.ko"]
    with pytest.raises(FileNotFoundError):
        tiny_guest.module_order(tmp_path, ("ahci",))


def test_cpio_archive_reads_back_with_cpio(tmp_path):
    archive = tmp_path / "i.img"
    tiny_guest.write_cpio(archive, {"bin": (stat.S_IFDIR | 0o755, b""),
                                    "bin/busybox": (stat.S_IFREG | 0o755, b"x" * 5),
                                    "bin/sh": (stat.S_IFLNK | 0o777, b"busybox")})
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=gzip.decompress(archive.read_bytes()), cwd=out, check=True)
    assert (out / "bin/busybox").read_bytes() == b"xxxxx"
    assert (out / "bin/sh").is_symlink() and str((out / "bin/sh").readlink()) == "busybox"


@contextlib.contextmanager
def booted(capsys, tag: str, **spec_changes):
    """A tiny-guest replica created through the driver; on the way out it is deleted with its
    network, and nothing may be left behind."""
    vm_boot.start_libvirtd()
    with capsys.disabled():
        # KVM only where the probe booted this same kernel through its init under KVM (agent.hw.kvm)
        virt, _verdict = choose_domain_type(host_probe())
    work = vm_boot.work_dir(tag)
    run = left = None
    try:
        guest = tiny_guest.build(work / "image")
        run = vm_boot.BootRun(work / "run", guest, virt)
        run.spec = dataclasses.replace(run.spec, **spec_changes)
        assert run.create() == "running"
        yield run
    finally:
        if run is not None:
            run.close()
            left = run.leftovers()
        shutil.rmtree(work, ignore_errors=True)
    assert left is not None and not any(left.values()), left


def test_guest_kernel_boots_on_our_domain_and_teardown_leaves_nothing(capsys):
    with booted(capsys, "boot-test") as run:
        conn = libvirt.open(vm_boot.URI)
        xml = conn.lookupByName(domain_name(run.replica_id)).XMLDesc(0)
        assert "<kernel>" in xml and f"type='{run.virt}'" in xml.split("\n")[0]  # the driver's direct-boot shape
        # Bounded: up to the guest kernel having loaded the drivers for our devices (virtio disk,
        # NIC and virtiofs, the SATA seed cdrom) and mounted the overlay as its root.
        console = vm_boot.wait_console(run, "tiny-initramfs: switch_root", 240)
        found = vm_boot.seed_findings(console, run)
        assert found["kernel_started"] and found["root_mounted"], console[-1500:]
        assert "insmod" not in console, console[-1500:]  # every module loaded


def test_an_engine_that_refuses_to_start_says_why_in_the_replica_log(capsys):
    """The TCG boot of a replica whose engine's own argument parser refuses its command line (~30 s
    here: the engine refuses before it would serve, so no /health wait): the parser's line reaches
    the host's engine log, which the agent serves (GET /v1/vms/{id}/logs, agent/vm/engine_log.py) to `fabricctl ai logs` and explain
    failure. It gets there only because the unit sends the engine's output to the console
    (images/guest/engine.service.in); the tiny guest's init routes StandardOutput as systemd does."""
    refusal = "argument --max-model-len: invalid int value: 'not-a-number'"
    with booted(capsys, "engine-error", extra_args=("--max-model-len", "not-a-number")) as run:
        console = vm_boot.wait_console(run, refusal, 420)
        served = read_chunk(run.driver.log_path(run.replica_id), -65536, 65536).text
        assert refusal in served, console[-2000:]
        assert "fabric-engine.service: exited 2" in vm_boot.wait_console(run, "fabric-engine.service: exited 2", 60)
