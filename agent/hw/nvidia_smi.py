"""Readings from `nvidia-smi` for the heartbeat: temperature, power draw, uncorrected ECC.

nvidia-smi can see what NVML through our process may not (and is what operators trust),
so the heartbeat overlays these on the NVML inventory with
gpu_inventory.apply_smi_readings. A missing binary, a non-zero exit or a timeout gives
None, which leaves the stored values unchanged; `[N/A]`-style fields give None per field.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass

from agent.hw.pci_sysfs import normalise_pci

log = logging.getLogger(__name__)

# The aggregate (lifetime) ECC count: the volatile one resets on every driver reload.
QUERY = "pci.bus_id,temperature.gpu,power.draw,ecc.errors.uncorrected.aggregate.total"


@dataclass(frozen=True)
class SmiReading:
    pci: str
    temperature_c: float | None
    power_w: float | None
    ecc_uncorrected: int | None


def smi_command(binary: str = "nvidia-smi") -> list[str]:
    return [binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]


def parse_smi_csv(text: str) -> dict[str, SmiReading]:
    """One reading per well-formed line, keyed by sysfs PCI address; bad lines are skipped."""
    readings: dict[str, SmiReading] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            continue
        try:
            pci = normalise_pci(fields[0])
        except ValueError:
            continue
        readings[pci] = SmiReading(
            pci=pci,
            temperature_c=_number(fields[1], float),
            power_w=_number(fields[2], float),
            ecc_uncorrected=_number(fields[3], int),
        )
    return readings


def read_smi(binary: str = "nvidia-smi", timeout_s: float = 10.0) -> dict[str, SmiReading] | None:
    """Run nvidia-smi once; None when it is absent or fails (callers keep what they had)."""
    path = shutil.which(binary)
    if path is None:
        return None
    try:
        done = subprocess.run(
            smi_command(path), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi did not run: %s", exc)
        return None
    if done.returncode != 0:
        log.warning("nvidia-smi exited %d: %s", done.returncode, done.stderr.strip()[:200])
        return None
    return parse_smi_csv(done.stdout)


def _number(text: str, kind: type):
    # nvidia-smi writes "[N/A]", "[Not Supported]" or "N/A" for readings it lacks.
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        return None
