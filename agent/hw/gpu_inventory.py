"""The node's NVIDIA GPUs as NVML sees them, in the shape the control plane stores.

NVML lists only NVIDIA devices, so other display adapters (an ASPEED BMC VGA, a Matrox)
never count; we do not cross-check sysfs class/vendor here. A missing library or driver
is a normal state for a host (GPUs bound to vfio-pci have no NVIDIA driver), so read()
returns an empty inventory with the reason instead of raising.

Readings NVML cannot give (not supported on a board, or a GPU already bound to vfio-pci)
stay 0, which the schema defines as unknown.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.hw.pci_sysfs import normalise_pci
from common.schemas import GpuInfo

if TYPE_CHECKING:
    from agent.hw.nvidia_smi import SmiReading

log = logging.getLogger(__name__)

@dataclass
class Inventory:
    gpus: list[GpuInfo]
    message: str


class NvmlInventory:
    """Reads the inventory through a pynvml-shaped module (the real one unless given)."""

    def __init__(self, nvml_module: Any = None):
        self._nvml = nvml_module
        # NVML init/shutdown are process-wide reference counts; serialise our use of them.
        self._lock = threading.Lock()

    def _module(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        import pynvml  # imported late: a host without the package still gets an inventory

        return pynvml

    def read(self) -> Inventory:
        try:
            nvml = self._module()
        except ImportError as exc:
            return Inventory([], f"NVML unavailable: python package nvidia-ml-py not installed ({exc.name})")
        error_cls = getattr(nvml, "NVMLError", Exception)
        with self._lock:
            try:
                nvml.nvmlInit()
            except error_cls as exc:
                return Inventory([], f"NVML unavailable: {exc} (no NVIDIA driver loaded or library missing)")
            except OSError as exc:
                return Inventory([], f"NVML unavailable: {exc}")
            try:
                return self._read_devices(nvml, error_cls)
            except error_cls as exc:
                return Inventory([], f"NVML error while listing GPUs: {exc}")
            finally:
                try:
                    nvml.nvmlShutdown()
                except error_cls as exc:
                    log.debug("nvmlShutdown failed: %s", exc)

    def _read_devices(self, nvml: Any, error_cls: type[BaseException]) -> Inventory:
        count = nvml.nvmlDeviceGetCount()
        gpus, lost = [], []
        for index in range(count):
            try:
                gpus.append(self._read_one(nvml, error_cls, index))
            except error_cls as exc:
                # One GPU that fell off the bus (Xid 79: GPU_IS_LOST) must not blank the others.
                lost.append(f"GPU {index}: {exc}")
        noun = "GPU" if count == 1 else "GPUs"
        message = f"{count} NVIDIA {noun} found" if count else "NVML found no NVIDIA GPUs"
        if lost:
            message += f"; unreadable: {', '.join(lost)}"
        return Inventory(gpus, message)

    def _read_one(self, nvml: Any, error_cls: type[BaseException], index: int) -> GpuInfo:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)

        def optional(fn, *args, default=0):
            # Each reading may be unsupported on a given board; that is "unknown", not a failure.
            try:
                return fn(handle, *args)
            except error_cls:
                return default

        mig = optional(nvml.nvmlDeviceGetMigMode, default=None)
        mig_enable = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        # (correctable rows, uncorrectable rows, pending, failure): H100/H200's memory health signal
        rows = optional(nvml.nvmlDeviceGetRemappedRows, default=None) if hasattr(
            nvml, "nvmlDeviceGetRemappedRows") else None
        return GpuInfo(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            pci=normalise_pci(nvml.nvmlDeviceGetPciInfo(handle).busId),
            memory_total_mib=int(memory.total) // (1024 * 1024),
            memory_used_mib=int(memory.used) // (1024 * 1024),
            temperature_c=float(optional(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU)),
            power_w=float(optional(nvml.nvmlDeviceGetPowerUsage)) / 1000.0,
            ecc_uncorrected=int(
                optional(
                    nvml.nvmlDeviceGetTotalEccErrors,
                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    # The lifetime counter: the volatile one resets on every driver reload.
                    getattr(nvml, "NVML_AGGREGATE_ECC", 1),
                )
            ),
            mig_mode=bool(mig is not None and mig[0] == mig_enable),
            driver="nvidia",
            remapped_rows_pending=bool(rows and rows[2]),
            remapped_rows_failed=bool(rows and rows[3]),
        )


def apply_smi_readings(gpus: list[GpuInfo], readings: dict[str, SmiReading] | None) -> list[GpuInfo]:
    """Overlay nvidia-smi readings on matching GPUs (by sysfs PCI address).

    None (binary missing or failed) leaves every value as it was; a field nvidia-smi
    reports as N/A also leaves that value as it was.
    """
    if not readings:
        return list(gpus)
    out = []
    for gpu in gpus:
        reading = readings.get(gpu.pci)
        if reading is None:
            out.append(gpu)
            continue
        changes: dict[str, float | int] = {}
        if reading.temperature_c is not None:
            changes["temperature_c"] = reading.temperature_c
        if reading.power_w is not None:
            changes["power_w"] = reading.power_w
        if reading.ecc_uncorrected is not None:
            changes["ecc_uncorrected"] = reading.ecc_uncorrected
        out.append(gpu.model_copy(update=changes))
    return out


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


__all__ = ["Inventory", "NvmlInventory", "apply_smi_readings"]
