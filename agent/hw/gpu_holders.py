"""Who holds one GPU open on a real host, and the NVIDIA daemons the binder may ask to let go.

A standard GPU host runs nvidia-persistenced, often DCGM (nv-hostengine) and, on HGX boards, the
fabric manager: all keep /dev/nvidia* files open. Counting any open /dev/nvidiaN as a holder of
every GPU refuses every bind on such a host, so holders are found per GPU:
- /dev/vfio/<group> for the GPU's IOMMU group (a QEMU still running);
- /dev/nvidia<minor>, the minor read from /proc/driver/nvidia/gpus/<bdf>/information
  ("Device Minor: N") while the nvidia driver owns the GPU;
- /dev/dri/cardN and /dev/dri/renderDN listed under the device's drm/ directory (present when
  nvidia_drm is loaded with modeset=1).
/dev/nvidiactl and /dev/nvidia-uvm are shared by all GPUs and do not block one GPU's unbind.
An NVSwitch (HGX boards) is held through /dev/nvidia-nvswitch<minor> (the minor from
/proc/driver/nvidia-nvswitch/devices/<bdf>/information) and /dev/nvidia-nvswitchctl: the host
fabric manager, NSCQ users (DCGM, nvidia-smi) keep them open; when the minor is not known, any
/dev/nvidia-nvswitch* counts, so a switch is never unbound from under a holder.

nvidia-persistenced lets go of a GPU when persistence mode is disabled for it:
`nvidia-smi -i <bdf> -pm 0` (NvidiaSmiDaemons); the binder does that before unbinding and turns
it back on when the GPU returns to nvidia.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Protocol

from agent.hw.pci_sysfs import link_name

_MINOR = re.compile(r"^Device Minor:\s*(\d+)", re.MULTILINE)

# What to tell the operator about a holder, by process name (comm is cut at 15 characters).
HOLDER_HINTS = {
    "nvidia-persiste": "nvidia-persistenced kept it open although persistence was disabled for this GPU",
    "nv-hostengine": "DCGM holds it: stop nvidia-dcgm or exclude this GPU from DCGM",
    "nv-fabricmanage": "the host fabric manager holds it: on HGX full passthrough the guest runs it "
                       "(systemctl stop nvidia-fabricmanager)",
    "nvidia-smi": "nvidia-smi (NSCQ) is reading the NVSwitches",
    "qemu-system-x86": "a VM still uses it",
    "xorg": "a display server uses it",
}


class GpuDaemons(Protocol):
    def set_persistence(self, bdf: str, enabled: bool) -> str | None:
        """Turn persistence mode on or off for one GPU; None on success, else why not."""
        ...


class NvidiaSmiDaemons:
    """`nvidia-smi -i BDF -pm 0|1`: the per-GPU persistence switch nvidia-persistenced obeys."""

    def __init__(self, binary: str = "nvidia-smi", timeout_s: float = 20):
        self.binary = binary
        self.timeout_s = timeout_s

    def set_persistence(self, bdf: str, enabled: bool) -> str | None:
        path = shutil.which(self.binary)
        if path is None:
            return "nvidia-smi is not installed"
        try:
            done = subprocess.run([path, "-i", bdf, "-pm", "1" if enabled else "0"], capture_output=True,
                                  text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"nvidia-smi -pm failed: {exc}"
        if done.returncode != 0:
            return f"nvidia-smi -i {bdf} -pm {int(enabled)} exited {done.returncode}: {done.stdout.strip()[:200]}"
        return None


NVSWITCH_NODE = "/dev/nvidia-nvswitch"  # + minor; also the shared nvidia-nvswitchctl
NVSWITCH_DRIVERS = ("nvidia", "nvidia-nvswitch")


def device_nodes(sysfs_root: Path, proc_root: Path, bdf: str) -> set[str]:
    """The /dev paths through which a process holds this one function. A path ending in "*"
    stands for every node with that prefix (an NVSwitch whose minor is not known)."""
    device = sysfs_root / "bus/pci/devices" / bdf
    nodes: set[str] = set()
    group = link_name(device / "iommu_group")
    if group:
        nodes.add(f"/dev/vfio/{group}")
    driver = link_name(device / "driver")
    if _is_nvswitch(device) and driver in NVSWITCH_DRIVERS:
        try:
            info = (proc_root / "driver/nvidia-nvswitch/devices" / bdf / "information").read_text()
        except OSError:
            info = ""
        match = _MINOR.search(info)
        nodes.add(f"{NVSWITCH_NODE}{match.group(1)}" if match else f"{NVSWITCH_NODE}*")
        nodes.add(f"{NVSWITCH_NODE}ctl")
        return nodes
    if driver == "nvidia":
        try:
            info = (proc_root / "driver/nvidia/gpus" / bdf / "information").read_text()
        except OSError:
            info = ""
        match = _MINOR.search(info)
        if match:
            nodes.add(f"/dev/nvidia{match.group(1)}")
        drm = device / "drm"
        if drm.is_dir():
            nodes.update(f"/dev/dri/{entry.name}" for entry in drm.iterdir()
                         if entry.name.startswith(("card", "renderD")))
    return nodes


def find_holders(proc_root: Path, nodes: set[str]) -> list[str]:
    """'pid N (comm)' for each process with one of `nodes` open."""
    found = []
    exact = {n for n in nodes if not n.endswith("*")}
    prefixes = tuple(n[:-1] for n in nodes if n.endswith("*"))
    for proc in sorted(proc_root.glob("[0-9]*"), key=lambda p: int(p.name)):
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target in exact or (prefixes and target.startswith(prefixes) and target[len(NVSWITCH_NODE):].isdigit()):
                    comm = (proc / "comm").read_text().strip()
                    found.append(f"pid {proc.name} ({comm})")
                    break
        except OSError:
            continue  # the process went away or is not ours to read
    return found


def _is_nvswitch(device: Path) -> bool:
    try:
        return ((device / "vendor").read_text().strip() == "0x10de"
                and (device / "class").read_text().strip().startswith("0x0680"))
    except OSError:
        return False


def holder_hints(holders: list[str]) -> str:
    hints = []
    for holder in holders:
        comm = holder.partition("(")[2].rstrip(")").lower()
        for name, hint in HOLDER_HINTS.items():
            if comm.startswith(name) and hint not in hints:
                hints.append(hint)
    return "; ".join(hints)


class LinuxKernelIO:
    """The real kernel: plain sysfs writes; holders found per function through /proc/*/fd."""

    def __init__(self, sysfs_root: Path = Path("/sys"), proc_root: Path = Path("/proc")):
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root

    def write(self, path: Path, value: str) -> None:
        with open(path, "w") as handle:
            handle.write(value)

    def holders(self, bdf: str) -> list[str]:
        return find_holders(self.proc_root, device_nodes(self.sysfs_root, self.proc_root, bdf))
