"""MIG instances on a real GPU through `nvidia-smi mig` (the driver's own tool).

    create:  nvidia-smi mig -i BDF -cgi PROFILE -C      a GPU instance and its compute instance
    destroy: nvidia-smi mig -i BDF -gi GI -ci CI -dci   then  nvidia-smi mig -i BDF -gi GI -dgi

Only when the agent runs with FABRIC_PCI_MIG=1: without it every call is refused, so an agent
never changes a GPU's partitioning unless its operator said so. The runner is a Protocol so
tests use a fake `nvidia-smi` on PATH (a script that records its arguments); nothing here
switches a GPU's MIG mode on or off (that needs a GPU reset and stays the operator's).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Protocol

from common.errors import Refused, TransientError

GI_CREATED = re.compile(r"created GPU instance ID\s+(\d+)", re.IGNORECASE)
CI_CREATED = re.compile(r"created compute instance ID\s+(\d+)", re.IGNORECASE)
TIMEOUT_S = 60


@dataclass(frozen=True)
class MigInstance:
    gpu_instance_id: int
    compute_instance_id: int


class MigRunner(Protocol):
    def create(self, bdf: str, profile: str) -> MigInstance: ...

    def destroy(self, bdf: str, gpu_instance_id: int, compute_instance_id: int) -> None: ...


class NvidiaSmiMig:
    def __init__(self, binary: str = "nvidia-smi"):
        self.binary = binary

    def _run(self, *args: str) -> str:
        exe = shutil.which(self.binary)
        if exe is None:
            raise Refused("nvidia-smi is not on this node's PATH: no NVIDIA driver to make MIG instances with")
        try:
            done = subprocess.run([exe, "mig", *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise TransientError(f"nvidia-smi mig {' '.join(args)} timed out after {TIMEOUT_S}s") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise Refused(f"nvidia-smi mig {' '.join(args)} failed ({done.returncode}): "
                          f"{detail[-1][:300] if detail else 'no output'}")
        return done.stdout

    def create(self, bdf: str, profile: str) -> MigInstance:
        out = self._run("-i", bdf, "-cgi", profile, "-C")
        gi, ci = GI_CREATED.search(out), CI_CREATED.search(out)
        if gi is None or ci is None:
            raise Refused(f"nvidia-smi mig -cgi {profile} on {bdf} did not report the instances it made")
        return MigInstance(int(gi.group(1)), int(ci.group(1)))

    def destroy(self, bdf: str, gpu_instance_id: int, compute_instance_id: int) -> None:
        gi, ci = str(gpu_instance_id), str(compute_instance_id)
        self._run("-i", bdf, "-gi", gi, "-ci", ci, "-dci")
        self._run("-i", bdf, "-gi", gi, "-dgi")
