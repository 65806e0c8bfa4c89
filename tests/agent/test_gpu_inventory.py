"""GPU inventory against the fake NVML module, and nvidia-smi readings from a real script on PATH."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from agent.hw import nvml_fake
from agent.hw.gpu_inventory import NvmlInventory, apply_smi_readings
from agent.hw.nvidia_smi import parse_smi_csv, read_smi
from agent.hw.nvml_fake import FakeNvml, make_gpus
from agent.hw.pci_sysfs import normalise_pci


def test_normalise_pci_from_nvml_forms():
    assert normalise_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalise_pci(b"00000000:C1:00.1\x00") == "0000:c1:00.1"
    assert normalise_pci("3B:00.0") == "0000:3b:00.0"
    assert normalise_pci("0001:AB:1F.7") == "0001:ab:1f.7"
    with pytest.raises(ValueError):
        normalise_pci("GPU-1234")


def test_h100_profile_inventory():
    fake = FakeNvml(make_gpus(2, "h100"))
    fake.gpus[1].memory_used_mib = 1024
    fake.gpus[1].temperature_c = 61
    fake.gpus[1].power_mw = 312_500
    inv = NvmlInventory(fake).read()
    assert inv.message == "2 NVIDIA GPUs found"
    assert [g.pci for g in inv.gpus] == ["0000:3b:00.0", "0000:3c:00.0"]
    assert [g.index for g in inv.gpus] == [0, 1]
    h = inv.gpus[1]
    assert h.name == "NVIDIA H100 80GB HBM3"
    assert h.memory_total_mib == 81_559  # 80 GiB class board as NVML reports it
    assert h.memory_used_mib == 1024
    assert h.temperature_c == 61 and h.power_w == 312.5
    assert h.uuid.startswith("GPU-h100-0001")
    assert fake.initialised is False  # shut down after reading


def test_h200_mig_and_ecc():
    fake = FakeNvml(make_gpus(1, "h200", first_bus=0xC1))
    fake.gpus[0].mig_mode = nvml_fake.NVML_DEVICE_MIG_ENABLE
    fake.gpus[0].ecc_aggregate = 3
    fake.gpus[0].ecc_uncorrected = 0  # a driver reload reset the volatile counter
    (gpu,) = NvmlInventory(fake).read().gpus
    assert gpu.memory_total_mib // 1024 == 140  # 141 GB board
    assert gpu.pci == "0000:c1:00.0"
    assert gpu.mig_mode is True
    assert gpu.ecc_uncorrected == 3


def test_unsupported_readings_are_zero_meaning_unknown():
    fake = FakeNvml(make_gpus(1, "l4"))
    g = fake.gpus[0]
    g.temperature_c = g.power_mw = g.ecc_uncorrected = g.ecc_aggregate = g.mig_mode = None
    (gpu,) = NvmlInventory(fake).read().gpus
    assert (gpu.temperature_c, gpu.power_w, gpu.ecc_uncorrected, gpu.mig_mode) == (0, 0, 0, False)


def test_nvml_init_error_gives_empty_inventory_with_reason():
    inv = NvmlInventory(FakeNvml(make_gpus(4), init_error=nvml_fake.NVML_ERROR_DRIVER_NOT_LOADED)).read()
    assert inv.gpus == []
    assert "Driver Not Loaded" in inv.message


def test_no_gpus_is_not_an_error():
    inv = NvmlInventory(FakeNvml([])).read()
    assert inv.gpus == [] and "no NVIDIA GPUs" in inv.message


def test_missing_library_gives_empty_inventory_with_reason(monkeypatch):
    # Simulate a host without nvidia-ml-py: the import itself fails.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    inv = NvmlInventory().read()
    assert inv.gpus == [] and "nvidia-ml-py" in inv.message


def test_real_pynvml_without_driver_gives_reason():
    pytest.importorskip("pynvml")
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this host has an NVIDIA driver")
    inv = NvmlInventory().read()
    assert inv.gpus == [] and inv.message.startswith("NVML unavailable")


def _fake_smi(tmp_path: Path, body: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_smi_readings_from_a_real_executable(tmp_path, monkeypatch):
    out = "00000000:3B:00.0, 44, 250.50, 0\n00000000:3C:00.0, [N/A], 99.00, 7\n"
    bindir = _fake_smi(
        tmp_path,
        f"""case "$*" in *--query-gpu=pci.bus_id,temperature.gpu,power.draw,*) ;; *) exit 9;; esac
printf '{out}'
""",
    )
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    readings = read_smi()
    assert readings is not None
    assert readings["0000:3b:00.0"].temperature_c == 44
    assert readings["0000:3b:00.0"].power_w == 250.5
    assert readings["0000:3c:00.0"].temperature_c is None

    gpus = NvmlInventory(FakeNvml(make_gpus(3))).read().gpus
    merged = apply_smi_readings(gpus, readings)
    assert merged[0].temperature_c == 44 and merged[0].power_w == 250.5
    assert merged[1].temperature_c == gpus[1].temperature_c  # N/A keeps the stored value
    assert merged[1].ecc_uncorrected == 7
    assert merged[2] == gpus[2]  # no reading for this address


def test_smi_failure_or_absence_leaves_values(tmp_path, monkeypatch):
    gpus = NvmlInventory(FakeNvml(make_gpus(1))).read().gpus
    bindir = _fake_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9\n")
    monkeypatch.setenv("PATH", str(bindir))
    assert read_smi() is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert read_smi() is None
    assert apply_smi_readings(gpus, None) == gpus


def test_parse_skips_garbage_lines():
    readings = parse_smi_csv("garbage\n\n00000000:01:00.0, 30, [Not Supported], [N/A]\n")
    assert list(readings) == ["0000:01:00.0"]
    assert readings["0000:01:00.0"].power_w is None and readings["0000:01:00.0"].ecc_uncorrected is None
