"""A stand-in for the `pynvml` module with N simulated GPUs.

It exposes the same function names, constants and error class that `pynvml` has, so
`NvmlInventory(nvml_module=FakeNvml(...))` runs the exact code path used on a GPU host.
Used by tests and by the lab's simulated GPUs, which is why it lives in product code.

Profiles mirror real boards: H100 SXM 80 GiB and H200 141 GiB (NVML reports memory in bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    """Same shape as pynvml.NVMLError: `.value` holds the NVML return code."""

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"Unknown Error {self.value}")


@dataclass
class FakeGpu:
    name: str
    memory_total_mib: int
    bus_id: str  # NVML form, 00000000:bb:dd.f
    uuid: str
    memory_used_mib: int = 0
    temperature_c: int | None = 35  # None: NVML says not supported
    power_mw: int | None = 70_000
    ecc_uncorrected: int | None = 0  # the volatile counter: reset by every driver reload
    ecc_aggregate: int | None = 0  # the lifetime counter (survives reloads)
    mig_mode: int | None = NVML_DEVICE_MIG_DISABLE
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure
    lost: bool = False  # Xid 79: every call on it answers GPU_IS_LOST


PROFILES: dict[str, tuple[str, int]] = {
    "h100": ("NVIDIA H100 80GB HBM3", 81_559),
    "h200": ("NVIDIA H200", 143_771),
    "a100": ("NVIDIA A100-SXM4-80GB", 81_920),
    "l4": ("NVIDIA L4", 23_034),
}


def make_gpus(count: int, profile: str = "h100", first_bus: int = 0x3B) -> list[FakeGpu]:
    """`count` GPUs of one profile on consecutive buses, with stable UUIDs."""
    name, memory = PROFILES[profile]
    return [
        FakeGpu(
            name=name,
            memory_total_mib=memory,
            bus_id=f"00000000:{first_bus + i:02X}:00.0",
            uuid=f"GPU-{profile}-{i:04d}-0000-0000-000000000000",
        )
        for i in range(count)
    ]


@dataclass
class _PciInfo:
    busId: str
    busIdLegacy: str
    pciDeviceId: int = 0x233010DE


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class FakeNvml:
    """Module-like object: pass it where `pynvml` would go.

    init_error: an NVML return code that nvmlInit raises (e.g. driver not loaded).
    """

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: int | None = None
    initialised: bool = False
    # With a FakeSysfs, NVML sees only GPUs the nvidia driver owns, like the real library:
    # a GPU bound to vfio-pci disappears from the count.
    sysfs: Any = None

    NVMLError = NVMLError
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = NVML_AGGREGATE_ECC
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return "550.90.07"

    def _visible(self) -> list[FakeGpu]:
        if self.sysfs is None:
            return self.gpus
        return [g for g in self.gpus if self.sysfs.driver_of(_sysfs_bdf(g.bus_id)) == "nvidia" or g.lost]

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check()
        visible = self._visible()
        if not 0 <= index < len(visible):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if visible[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return visible[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        _alive(handle)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> _PciInfo:
        return _PciInfo(busId=handle.bus_id, busIdLegacy=handle.bus_id[4:])

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> _Memory:
        total = handle.memory_total_mib * 1024 * 1024
        used = handle.memory_used_mib * 1024 * 1024
        return _Memory(total=total, used=used, free=total - used)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return _supported(handle.temperature_c)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return _supported(handle.power_mw)

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, error_type: int, counter: int) -> int:
        _alive(handle)
        return _supported(handle.ecc_aggregate if counter == NVML_AGGREGATE_ECC else handle.ecc_uncorrected)

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu) -> tuple[int, int, int, int]:
        _alive(handle)
        if handle.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.remapped_rows

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        mode = _supported(handle.mig_mode)
        return [mode, mode]  # [current, pending]

    def _check(self) -> None:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _alive(handle: FakeGpu) -> None:
    if handle.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)


def _sysfs_bdf(bus_id: str) -> str:
    domain, bus, rest = bus_id.split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def _supported(value: int | None) -> int:
    if value is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value
