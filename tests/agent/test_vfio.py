"""VFIO bind/release against the on-disk fake sysfs tree that reacts to writes like the kernel."""

from __future__ import annotations

import threading

import pytest

from agent.hw.sysfs_fake import FakeSysfs
from agent.hw.vfio import VfioBinder, plan_bind
from common.errors import NotFound, Refused

GPU = "0000:3b:00.0"
AUDIO = "0000:3b:00.1"
BRIDGE = "0000:3a:00.0"


@pytest.fixture
def host(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.add_gpu(GPU, group=12, audio=True, bridge=BRIDGE)
    fake.add_gpu("0000:3c:00.0", group=13)
    return fake


def binder(fake, tmp_path=None, **kw):
    kw.setdefault("timeout_s", 2)
    kw.setdefault("hold_wait_s", 0.3)
    kw.setdefault("poll_s", 0.05)
    return VfioBinder(fake.root, kernel=fake.kernel, **kw)


def test_bind_moves_gpu_and_audio_but_not_bridge(host):
    b = binder(host)
    result = b.bind(GPU)
    assert result.functions == [GPU, AUDIO]
    assert result.original_drivers == {GPU: "nvidia", AUDIO: "snd_hda_intel"}
    assert host.driver_of(GPU) == host.driver_of(AUDIO) == "vfio-pci"
    assert host.driver_of(BRIDGE) == "pcieport"
    assert b.status(GPU) == "vfio-pci"
    assert host.driver_of("0000:3c:00.0") == "nvidia"  # another group is untouched
    assert (host.root / f"bus/pci/devices/{GPU}/driver_override").read_text().strip() == "vfio-pci"


def test_release_restores_original_drivers_and_both_are_idempotent(host):
    b = binder(host)
    b.bind(GPU)
    again = b.bind(GPU)
    assert "already" in again.message and host.driver_of(GPU) == "vfio-pci"
    released = b.release(GPU)
    assert released.original_drivers == {GPU: "nvidia", AUDIO: "snd_hda_intel"}
    assert host.driver_of(GPU) == "nvidia" and host.driver_of(AUDIO) == "snd_hda_intel"
    assert (host.root / f"bus/pci/devices/{GPU}/driver_override").read_text().strip() == "(null)"
    second = b.release(GPU)
    assert "was not bound" in second.message and host.driver_of(GPU) == "nvidia"


def test_unknown_device_is_not_found(host):
    with pytest.raises(NotFound):
        binder(host).bind("0000:99:00.0")
    with pytest.raises(NotFound):
        binder(host).status("0000:99:00.0")


def test_no_iommu_groups_refused(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.add_gpu(GPU, group=None)
    with pytest.raises(Refused, match="no IOMMU groups"):
        binder(fake).bind(GPU)
    assert fake.driver_of(GPU) == "nvidia"


def test_sriov_vfs_refused(tmp_path):
    fake = FakeSysfs(tmp_path / "sys")
    fake.add_gpu(GPU, group=5, sriov_total=16)
    fake.set_sriov(GPU, 4)
    with pytest.raises(Refused, match="SR-IOV"):
        binder(fake).bind(GPU)
    assert fake.driver_of(GPU) == "nvidia"
    fake.set_sriov(GPU, 0)
    assert binder(fake).bind(GPU).functions == [GPU]


def test_vfio_driver_missing_refused(host):
    host.remove_driver("vfio-pci")
    with pytest.raises(Refused, match="modprobe vfio-pci"):
        binder(host).bind(GPU)


def test_held_device_refused_after_bounded_wait_with_nothing_moved(host):
    host.hold(AUDIO, "pid 77 (pulseaudio)")
    with pytest.raises(Refused, match=r"pid 77 \(pulseaudio\)"):
        binder(host).bind(GPU)
    # The check happens before any write, so the GPU did not move alone.
    assert host.driver_of(GPU) == "nvidia" and host.driver_of(AUDIO) == "snd_hda_intel"


def test_holder_that_lets_go_within_the_wait_is_fine(host):
    host.hold(GPU)
    timer = threading.Timer(0.1, host.let_go, args=(GPU,))
    timer.start()
    try:
        binder(host, hold_wait_s=5).bind(GPU)
    finally:
        timer.cancel()
    assert host.driver_of(GPU) == "vfio-pci"


def test_release_refused_while_a_vm_holds_the_group(host):
    b = binder(host)
    b.bind(GPU)
    host.hold(GPU, "pid 9 (qemu-system-x86)")
    with pytest.raises(Refused, match="qemu"):
        b.release(GPU)
    assert host.driver_of(GPU) == "vfio-pci"
    host.let_go(GPU)
    b.release(GPU)
    assert host.driver_of(GPU) == "nvidia"


def test_interrupted_bind_is_recorded_refused_and_fixed_after_operator_clear(host, tmp_path):
    """The audio function's unbind hangs in the kernel after the GPU already moved.

    What happens: the bind raises Refused naming the stuck write; the GPU is on vfio-pci
    and the audio function has override=vfio-pci and still its old driver. Every later
    bind or release of the group is refused (never retried blindly), also from a new
    binder with the same state_dir (an agent restart). Once the write completes and the
    operator clears the record, a retried bind finishes the group, and a release returns
    every function to its own driver.
    """
    state = tmp_path / "vfio-state"
    event = host.stick("drivers/snd_hda_intel/unbind")
    b = binder(host, timeout_s=0.3, state_dir=state)
    with pytest.raises(Refused, match="did not finish"):
        b.bind(GPU)
    assert host.driver_of(GPU) == "vfio-pci"
    assert host.driver_of(AUDIO) == "snd_hda_intel"
    assert AUDIO in b.stuck()

    restarted = binder(host, state_dir=state)
    for action in (restarted.bind, restarted.release):
        with pytest.raises(Refused, match="never finished"):
            action(GPU)

    # The kernel finally returns from the stuck write (the worker thread completes).
    host.unstick("drivers/snd_hda_intel/unbind")
    assert event.is_set()
    for _ in range(100):
        if host.driver_of(AUDIO) == "none":
            break
        threading.Event().wait(0.02)
    assert host.driver_of(AUDIO) == "none"

    assert restarted.clear_stuck(AUDIO) is True
    assert restarted.stuck() == {}
    restarted.bind(GPU)
    assert host.driver_of(AUDIO) == "vfio-pci"
    restarted.release(GPU)
    assert host.driver_of(GPU) == "nvidia" and host.driver_of(AUDIO) == "snd_hda_intel"


def test_interrupted_bind_release_path(host, tmp_path):
    host.stick("drivers/snd_hda_intel/unbind")
    b = binder(host, timeout_s=0.3)
    with pytest.raises(Refused):
        b.bind(GPU)
    host.unstick("drivers/snd_hda_intel/unbind")
    for _ in range(100):
        if host.driver_of(AUDIO) == "none":
            break
        threading.Event().wait(0.02)
    b.clear_stuck(AUDIO)
    result = b.release(GPU)
    assert result.original_drivers == {GPU: "nvidia", AUDIO: "snd_hda_intel"}


def test_plan_is_pure_and_skips_bound_functions(host):
    b = binder(host)
    facts = b._facts(GPU)
    plan = plan_bind(facts)
    assert [s.bdf for s in plan.steps] == [GPU, AUDIO]
    assert plan.steps[0].writes[0].path == f"bus/pci/devices/{GPU}/driver_override"
    assert host.driver_of(GPU) == "nvidia"  # planning wrote nothing
