"""The guest's 64-bit PCI MMIO aperture (OVMF's X-PciMmio64Mb): the rule the planner
(agent/vm/host_tuning.py, from the BAR sizes sysfs reports) and the renderer
(agent/vm/domain_xml.py, estimated from GPU memory when no BAR sizes were read) both use.
"""

from __future__ import annotations

DEFAULT_GPU_MEMORY_MIB = 131_072  # when the spec does not say: size as for a 128 GiB board
MIN_MMIO64_MIB = 65_536


def mmio64_mib(gpu_count: int, gpu_memory_mib: int) -> int:
    """The OVMF 64-bit aperture: per GPU its BAR1 (memory rounded up to a power of two,
    as boards expose it) twice over, for BAR0/BAR3 and power-of-two alignment."""
    if gpu_count == 0:
        return 0
    per_gpu = _pow2_at_least(gpu_memory_mib or DEFAULT_GPU_MEMORY_MIB) * 2
    return max(MIN_MMIO64_MIB, _pow2_at_least(per_gpu * gpu_count))


def guest_mmio64_mib(bars64_mib: list[int]) -> int:
    """The OVMF 64-bit aperture from the 64-bit BAR totals sysfs reports for each passed-through
    function: twice their sum (power-of-two alignment of each BAR and root-port window), rounded
    up to a power of two, at least MIN_MMIO64_MIB. 0 when nothing has a 64-bit BAR."""
    total = sum(bars64_mib)
    if total <= 0:
        return 0
    return max(MIN_MMIO64_MIB, _pow2_at_least(2 * total))


def _pow2_at_least(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())
