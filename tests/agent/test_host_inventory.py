"""The merged inventory (NVML + sysfs) against fakes that behave like a real host: NVML stops
seeing a GPU once it is on vfio-pci, a GPU falls off the bus, an HGX board has NVSwitches."""

from __future__ import annotations

import pytest

from agent.hw import nvml_fake
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.host_inventory import HostInventory
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.hw.sysfs_fake import FakeSysfs
from agent.hw.vfio import VfioBinder
from agent.vm.mmio import guest_mmio64_mib


def host(tmp_path, count=2, profile="h100", device_id="0x2330", nvswitches=0):
    fake = FakeSysfs(tmp_path / "sys")
    gpus = make_gpus(count, profile)
    for i, _gpu in enumerate(gpus):
        bdf = f"0000:{0x3b + i:02x}:00.0"
        fake.add_gpu(bdf, group=20 + i, audio=True, device_id=device_id, numa_node=i // 4)
    for i in range(nvswitches):
        fake.add_nvswitch(f"0000:{0x05 + i:02x}:00.0", group=60 + i)
    nvml = FakeNvml(gpus=gpus, sysfs=fake)
    inventory = HostInventory(NvmlInventory(nvml), fake.root, state_file=tmp_path / "state/gpus.json")
    return fake, nvml, inventory


def binder(fake):
    return VfioBinder(fake.root, kernel=fake.kernel, daemons=fake.daemons, proc_root=fake.proc,
                      vfio_ids=frozenset(), hold_wait_s=0.2, poll_s=0.05)


def test_vfio_bound_gpu_is_reported_from_sysfs_not_dropped(tmp_path):
    fake, nvml, inv = host(tmp_path)
    first = {g.pci: g for g in inv.read().gpus}
    assert first["0000:3b:00.0"].driver == "nvidia" and first["0000:3b:00.0"].readings_live
    binder(fake).bind("0000:3b:00.0")
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 1  # NVML no longer sees the bound GPU
    nvml.nvmlShutdown()
    after = {g.pci: g for g in inv.read().gpus}
    bound = after["0000:3b:00.0"]
    assert set(after) == set(first)
    assert bound.driver == "vfio-pci" and not bound.readings_live and bound.state == "ok"
    assert bound.uuid == first["0000:3b:00.0"].uuid and bound.memory_total_mib == 81_559
    assert bound.iommu_group == "20" and bound.numa_node == 0 and bound.pci_id == "10de:2330"
    assert bound.bar64_mib == 128 * 1024 + 32


def test_bound_before_the_agent_started_still_reported_with_board_facts(tmp_path):
    fake, nvml, _ = host(tmp_path, 1, "h200", "0x2335")
    binder(fake).bind("0000:3b:00.0")
    fresh = HostInventory(NvmlInventory(nvml), fake.root)  # nothing remembered
    (gpu,) = fresh.read().gpus
    assert gpu.name == "NVIDIA H200" and gpu.memory_total_mib == 143_771 and gpu.driver == "vfio-pci"


@pytest.mark.parametrize("device_id, name, mib", [
    ("0x26b9", "NVIDIA L40S", 46_068), ("0x2331", "NVIDIA H100 PCIe", 81_559), ("0x2321", "NVIDIA H100 NVL", 95_830),
    ("0x233b", "NVIDIA H200 NVL", 143_771), ("0x20b0", "NVIDIA A100-SXM4-40GB", 40_960),
    ("0x20f1", "NVIDIA A100-PCIE-40GB", 40_960), ("0x20b5", "NVIDIA A100 80GB PCIe", 81_920),
    ("0x2901", "NVIDIA B200", 183_359)])
def test_every_placed_board_is_sized_before_nvml_sees_it(tmp_path, device_id, name, mib):
    fake, nvml, _ = host(tmp_path, 1, "h100", device_id)
    binder(fake).bind("0000:3b:00.0")
    (gpu,) = HostInventory(NvmlInventory(nvml), fake.root).read().gpus
    assert (gpu.name, gpu.memory_total_mib, gpu.pci_id) == (name, mib, "10de:" + device_id[2:])


def test_a_board_we_cannot_size_is_reported_so(tmp_path):
    fake, nvml, _ = host(tmp_path, 1, "h100", "0x2bad")
    binder(fake).bind("0000:3b:00.0")
    result = HostInventory(NvmlInventory(nvml), fake.root).read()
    assert result.gpus[0].memory_total_mib == 0 and result.gpus[0].name == "NVIDIA [10de:2bad]"
    assert "0000:3b:00.0 (10de:2bad) cannot be sized" in result.message


def test_remembered_across_restart_through_the_state_file(tmp_path):
    fake, nvml, inv = host(tmp_path, 1)
    uuid = inv.read().gpus[0].uuid
    binder(fake).bind("0000:3b:00.0")
    again = HostInventory(NvmlInventory(nvml), fake.root, state_file=tmp_path / "state/gpus.json")
    assert again.read().gpus[0].uuid == uuid


def test_one_lost_gpu_is_reported_lost_and_the_others_kept(tmp_path):
    fake, nvml, inv = host(tmp_path, 3)
    inv.read()
    nvml.gpus[1].lost = True  # NVML: GPU_IS_LOST on every call
    fake.lose("0000:3c:00.0")  # sysfs: config space reads 0xffff
    result = inv.read()
    states = {g.pci: g.state for g in result.gpus}
    assert states == {"0000:3b:00.0": "ok", "0000:3c:00.0": "lost", "0000:3d:00.0": "ok"}
    assert "lost" in result.message and "GPU is lost" in result.message


def test_remapped_rows_and_aggregate_ecc_are_read(tmp_path):
    _fake, nvml, inv = host(tmp_path, 1)
    nvml.gpus[0].remapped_rows = (0, 2, 1, 0)
    nvml.gpus[0].ecc_aggregate = 5
    nvml.gpus[0].ecc_uncorrected = 0
    (gpu,) = inv.read().gpus
    assert gpu.remapped_rows_pending and not gpu.remapped_rows_failed and gpu.ecc_uncorrected == 5
    nvml.gpus[0].remapped_rows = (0, 2, 0, 0)  # the reset applied the remap
    assert not inv.read().gpus[0].remapped_rows_pending


def test_nvswitches_listed_and_mmio_window_from_bars(tmp_path):
    _fake, _nvml, inv = host(tmp_path, 8, "h200", "0x2335", nvswitches=4)
    result = inv.read()
    assert result.nvswitches == ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    total = sum(g.bar64_mib for g in result.gpus)
    assert total == 8 * (256 * 1024 + 32)
    window = guest_mmio64_mib([g.bar64_mib for g in result.gpus] + [32] * 4)
    assert window >= 2 * total  # room for alignment; the memory-based guess (4 TiB) is less
    assert window > 4 * 1024 * 1024


def test_nvml_missing_everything_still_from_sysfs(tmp_path):
    fake, nvml, _ = host(tmp_path, 2)
    nvml.init_error = nvml_fake.NVML_ERROR_DRIVER_NOT_LOADED
    inv = HostInventory(NvmlInventory(nvml), fake.root)
    result = inv.read()
    assert [g.pci for g in result.gpus] == ["0000:3b:00.0", "0000:3c:00.0"]
    assert all(not g.readings_live for g in result.gpus) and "Driver Not Loaded" in result.message
