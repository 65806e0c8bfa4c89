"""VFIO on GPU hosts as they are: NVIDIA daemons holding device files, IOMMU groups shared
with other devices, hosts booted with vfio-pci.ids=, the keep-bound pool, the post-release
health check, and per-GPU holders found through a /proc tree (the real LinuxKernelIO)."""

from __future__ import annotations

import os

import pytest

from agent.hw.gpu_holders import LinuxKernelIO, device_nodes
from agent.hw.sysfs_fake import FakeSysfs
from agent.hw.vfio import VfioBinder, read_vfio_ids
from common.errors import Refused

GPU0, GPU1 = "0000:3b:00.0", "0000:5d:00.0"


def make_binder(fake, **kw):
    kw.setdefault("timeout_s", 2)
    kw.setdefault("hold_wait_s", 0.3)
    kw.setdefault("poll_s", 0.05)
    kw.setdefault("vfio_ids", frozenset(fake.vfio_ids))
    return VfioBinder(fake.root, kernel=fake.kernel, daemons=fake.daemons, proc_root=fake.proc, **kw)


@pytest.fixture
def host(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.add_gpu(GPU0, group=12, audio=True)
    fake.add_gpu(GPU1, group=13, audio=True)
    return fake


def test_persistenced_holding_every_gpu_does_not_block_a_bind(host):
    host.persistenced()  # holds both GPUs, as on every standard host
    daemons = host.daemons
    b = VfioBinder(host.root, kernel=host.kernel, daemons=daemons, proc_root=host.proc, vfio_ids=frozenset(),
                   timeout_s=2, hold_wait_s=0.3, poll_s=0.05)
    b.bind(GPU0)
    assert host.driver_of(GPU0) == "vfio-pci"
    assert daemons.calls == [f"{GPU0} -pm 0"]  # only the GPU being bound
    assert host.driver_of(GPU1) == "nvidia" and host.held[GPU1]  # the other keeps its persistence
    b.release(GPU0)
    assert host.driver_of(GPU0) == "nvidia"
    assert daemons.calls == [f"{GPU0} -pm 0", f"{GPU0} -pm 1"]  # turned back on where we turned it off


def test_dcgm_still_holding_names_it_and_what_was_tried(host):
    host.persistenced()
    host.hold(GPU0, "pid 900 (nv-hostengine)")
    with pytest.raises(Refused) as err:
        make_binder(host).bind(GPU0)
    msg = err.value.message
    assert "pid 900 (nv-hostengine)" in msg and "nvidia-persiste" not in msg
    assert "-pm 0" in msg and "DCGM" in msg
    assert host.driver_of(GPU0) == "nvidia" and host.driver_of(GPU0[:-1] + "1") == "snd_hda_intel"


def test_group_with_a_foreign_device_is_refused_listing_the_group(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.add_gpu(GPU0, group=40, audio=True, bridge="0000:3a:00.0")
    fake.add_foreign("0000:3c:00.0", group=40, kind="nic")
    with pytest.raises(Refused) as err:
        make_binder(fake).bind(GPU0)
    msg = err.value.message
    assert "IOMMU group 40" in msg and "0000:3c:00.0" in msg and "mlx5_core" in msg
    assert "0000:3a:00.0" in msg  # every member listed, the bridge too
    assert fake.driver_of("0000:3c:00.0") == "mlx5_core" and fake.driver_of(GPU0) == "nvidia"


def test_vfio_pci_ids_host_release_means_not_ours(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.vfio_ids = {"10de:2330"}
    fake.add_gpu(GPU0, group=12)  # claimed by vfio-pci at boot
    assert fake.driver_of(GPU0) == "vfio-pci"
    b = make_binder(fake)
    assert "already bound" in b.bind(GPU0).message
    result = b.release(GPU0)
    assert fake.driver_of(GPU0) == "vfio-pci"
    assert "stay on vfio-pci" in result.message and "vfio-pci.ids" in result.message
    assert "health check failed" not in result.message
    # The override we wrote at bind (none here: it was already bound) never lingers.
    assert (fake.root / "bus/pci/devices" / GPU0 / "driver_override").read_text().strip() == "(null)"


def test_vfio_pci_ids_host_after_our_override_clears_it_and_keeps_vfio(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.add_gpu(GPU0, group=12)
    fake.vfio_ids = {"10de:2330"}  # the ids are known, but this GPU booted on nvidia
    b = make_binder(fake)
    b.bind(GPU0)
    result = b.release(GPU0)
    assert fake.driver_of(GPU0) == "vfio-pci"  # reprobing would only bind vfio-pci again
    assert (fake.root / "bus/pci/devices" / GPU0 / "driver_override").read_text().strip() == "(null)"
    assert "stay on vfio-pci" in result.message


def test_keep_bound_pool_leaves_gpus_on_vfio_between_vms(host):
    b = make_binder(host, keep_bound=True)
    b.bind(GPU0)
    result = b.release(GPU0)
    assert host.driver_of(GPU0) == "vfio-pci" and "FABRIC_VFIO_KEEP_BOUND" in result.message
    assert "already bound" in b.bind(GPU0).message  # the next VM takes it without a bounce


def test_post_release_health_check_reports_a_lost_gpu(host):
    b = make_binder(host)
    b.bind(GPU0)
    host.lose(GPU0)  # Xid 79 while in the VM
    result = b.release(GPU0)
    assert "health check failed" in result.message and "does not answer" in result.message


def test_healthy_release_has_no_health_complaint(host):
    b = make_binder(host)
    b.bind(GPU0)
    assert "health check" not in b.release(GPU0).message
    assert (host.proc / "driver/nvidia/gpus" / GPU0 / "information").exists()


def test_read_vfio_ids_from_cmdline_and_modprobe(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cmdline").write_text("BOOT_IMAGE=/vmlinuz ro intel_iommu=on vfio-pci.ids=10DE:2330,10de:22a3 quiet\n")
    modprobe = tmp_path / "modprobe.d"
    modprobe.mkdir()
    (modprobe / "vfio.conf").write_text("options vfio_pci disable_vga=1 ids=10de:2335\n")
    assert read_vfio_ids(proc, modprobe) == {"10de:2330", "10de:22a3", "10de:2335"}
    (proc / "cmdline").write_text("ro quiet\n")
    assert read_vfio_ids(proc, tmp_path / "none") == frozenset()


def _fake_proc_process(proc, pid, comm, targets):
    fd_dir = proc / str(pid) / "fd"
    fd_dir.mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    for i, target in enumerate(targets):
        os.symlink(target, fd_dir / str(i))


def test_linux_holders_are_per_gpu_minor_and_drm_nodes(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.modeset = True
    fake.add_gpu(GPU0, group=12)
    fake.add_gpu(GPU1, group=13)
    proc = fake.proc
    assert device_nodes(fake.root, proc, GPU0) == {"/dev/vfio/12", "/dev/nvidia0", "/dev/dri/card1",
                                                   "/dev/dri/renderD128"}
    # persistenced-like: every GPU open, plus the shared control nodes
    _fake_proc_process(proc, 812, "nvidia-persiste", ["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia-uvm"])
    _fake_proc_process(proc, 901, "python3", ["/dev/dri/renderD128"])
    kernel = LinuxKernelIO(fake.root, proc)
    assert kernel.holders(GPU0) == ["pid 901 (python3)"]  # nvidiactl and GPU1's node do not count
    assert kernel.holders(GPU1) == ["pid 812 (nvidia-persiste)"]


def test_nvidia_smi_daemons_runs_the_per_gpu_persistence_switch(tmp_path, monkeypatch):
    from agent.hw.gpu_holders import NvidiaSmiDaemons

    log = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$2" = "0000:ff:00.0" ] && {{ echo "No devices found"; exit 6; }}\nexit 0\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    daemons = NvidiaSmiDaemons()
    assert daemons.set_persistence(GPU0, False) is None
    assert daemons.set_persistence(GPU0, True) is None
    assert log.read_text().splitlines() == [f"-i {GPU0} -pm 0", f"-i {GPU0} -pm 1"]
    problem = daemons.set_persistence("0000:ff:00.0", False)
    assert "exited 6" in problem and "No devices found" in problem
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "not installed" in NvidiaSmiDaemons().set_persistence(GPU0, False)


def test_when_persistence_cannot_be_disabled_the_message_says_why(host):
    host.persistenced()

    class Broken:
        def set_persistence(self, bdf, enabled):
            return "nvidia-smi is not installed"

    b = VfioBinder(host.root, kernel=host.kernel, daemons=Broken(), proc_root=host.proc, vfio_ids=frozenset(),
                   timeout_s=2, hold_wait_s=0.2, poll_s=0.05)
    with pytest.raises(Refused) as err:
        b.bind(GPU0)
    msg = err.value.message
    assert "nvidia-persiste" in msg and "could not be disabled: nvidia-smi is not installed" in msg


def test_nvswitch_holders_are_found_through_the_nvswitch_nodes(tmp_path):
    from agent.hw.gpu_holders import holder_hints

    fake = FakeSysfs(tmp_path / "sys")
    sw0, sw1 = "0000:05:00.0", "0000:06:00.0"
    fake.add_nvswitch(sw0, group=40)
    fake.add_nvswitch(sw1, group=41)
    proc = fake.proc
    info = proc / "driver/nvidia-nvswitch/devices" / sw0 / "information"
    info.parent.mkdir(parents=True)
    info.write_text("Device Minor: \t 2\nBus Location: 0000:05:00.0\n")
    assert device_nodes(fake.root, proc, sw0) == {"/dev/vfio/40", "/dev/nvidia-nvswitch2",
                                                  "/dev/nvidia-nvswitchctl"}
    assert device_nodes(fake.root, proc, sw1) == {"/dev/vfio/41", "/dev/nvidia-nvswitch*", "/dev/nvidia-nvswitchctl"}
    _fake_proc_process(proc, 700, "nv-fabricmanage", ["/dev/nvidia-nvswitch2", "/dev/nvidia-nvswitch3"])
    _fake_proc_process(proc, 701, "nv-hostengine", ["/dev/nvidia-nvswitchctl"])  # DCGM through NSCQ
    _fake_proc_process(proc, 702, "python3", ["/dev/nvidia0", "/dev/nvidia-nvswitchX"])
    kernel = LinuxKernelIO(fake.root, proc)
    assert kernel.holders(sw0) == ["pid 700 (nv-fabricmanage)", "pid 701 (nv-hostengine)"]
    # minor unknown: any switch node counts, never a GPU node or a look-alike name
    assert kernel.holders(sw1) == ["pid 700 (nv-fabricmanage)", "pid 701 (nv-hostengine)"]
    hints = holder_hints(kernel.holders(sw0))
    assert "fabric manager" in hints and "DCGM" in hints
