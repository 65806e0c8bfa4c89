"""Read-only checks of a GPU host, run by scripts/devcheck-gpu-host: what the agent reads, read
the way the agent reads it, written as raw fixtures plus one JSON summary.

Checks, in order (each one is bounded; the whole run stays under ``deadline_s``, 6 minutes):
  smi-query      the heartbeat's exact command (agent.hw.nvidia_smi.smi_command) and its parse
  smi-xml        ``nvidia-smi -q -x`` (every property the driver reports, XML)
  smi-topo       ``nvidia-smi topo -m`` (NVLink/PCIe matrix, CPU and NUMA affinity)
  nvml           agent.hw.gpu_inventory.NvmlInventory.read() through pynvml
  sysfs          agent.hw.host_inventory.HostInventory.read() (NVML merged with sysfs, no state
                 file), the raw attributes it reads per NVIDIA function, and /proc/driver/nvidia
  holders        who holds each GPU's device nodes (agent.hw.gpu_holders, the binder's scan)
  vfio-plan      VfioBinder.preview(): the bind and release plans, never applied
  cuda           cuInit(0), cuDriverGetVersion and cuDeviceGetCount through ctypes on libcuda.so.1

Never: a write under /sys, a GPU reset, a persistence, MIG, ECC, clock or power change, a module
load. The binder is built with a KernelIO whose write refuses, and without the GPU daemons (the
persistence switch), so even a bug here cannot move a GPU. A host without GPUs (no nvidia-smi,
no NVML, no NVIDIA functions, no libcuda) is reported as "no GPU", not as a failure.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.hw.gpu_holders import device_nodes, find_holders
from agent.hw.gpu_inventory import NvmlInventory
from agent.hw.host_inventory import HostInventory
from agent.hw.nvidia_smi import parse_smi_csv, smi_command
from agent.hw.pci_sysfs import link_name, nvidia_functions
from agent.hw.vfio import VfioBinder

SMI_READ_ONLY = (("-q", "-x"), ("topo", "-m"))  # with the heartbeat's query: every nvidia-smi run here
SYSFS_ATTRS = ("class", "vendor", "device", "subsystem_vendor", "subsystem_device", "numa_node", "resource",
               "driver_override", "sriov_numvfs", "sriov_totalvfs", "current_link_speed", "current_link_width",
               "max_link_speed", "max_link_width")
SYSFS_LINKS = ("driver", "iommu_group")


@dataclass
class Check:
    name: str
    status: str  # ok | absent (nothing to check on this host) | failed | skipped (out of time)
    detail: str
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DevcheckConfig:
    out: Path
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    nvidia_smi: str = "nvidia-smi"
    nvml: Any = None  # a pynvml-shaped module; None: pynvml itself
    libcuda: str = "libcuda.so.1"
    command_timeout_s: float = 90.0
    deadline_s: float = 360.0


class _NoWrites:
    """The binder's KernelIO here: reading holders is allowed, writing never is."""

    def __init__(self, sysfs_root: Path, proc_root: Path):
        self.sysfs_root, self.proc_root = sysfs_root, proc_root

    def write(self, path: Path, value: str) -> None:
        raise PermissionError(f"devcheck never writes ({path})")

    def holders(self, bdf: str) -> list[str]:
        return find_holders(self.proc_root, device_nodes(self.sysfs_root, self.proc_root, bdf))


class Devcheck:
    def __init__(self, cfg: DevcheckConfig, clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.clock = clock
        self.started = clock()
        self.checks: list[Check] = []
        cfg.out.mkdir(parents=True, exist_ok=True)

    # -- helpers --------------------------------------------------------------------------------
    def _write(self, name: str, data: str | bytes | dict | list) -> str:
        path = self.cfg.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, (dict, list)):
            path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        elif isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        return name

    def _left(self) -> float:
        return self.cfg.deadline_s - (self.clock() - self.started)

    def _smi(self, args: list[str], name: str) -> tuple[Check, str | None]:
        binary = shutil.which(self.cfg.nvidia_smi)
        if binary is None:
            return Check(name, "absent", f"{self.cfg.nvidia_smi} is not installed"), None
        argv = [binary, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=min(self.cfg.command_timeout_s, max(self._left(), 1.0)))
        except subprocess.TimeoutExpired:
            return Check(name, "failed", f"{' '.join(argv)} did not finish in {self.cfg.command_timeout_s:g}s"), None
        except OSError as exc:
            return Check(name, "failed", f"{' '.join(argv)}: {exc}"), None
        stem = name.replace("-", "_")
        files = [self._write(f"{stem}.stdout", done.stdout)]
        if done.stderr:
            files.append(self._write(f"{stem}.stderr", done.stderr))
        if done.returncode != 0:
            text = (done.stdout + done.stderr).strip().splitlines()
            return Check(name, "failed", f"{' '.join(argv[1:])} exited {done.returncode}: "
                                         f"{text[-1] if text else ''}", files), None
        return Check(name, "ok", f"{' '.join(argv[1:])}: {len(done.stdout)} bytes", files), done.stdout

    # -- checks ---------------------------------------------------------------------------------
    def smi_query(self) -> Check:
        args = smi_command(self.cfg.nvidia_smi)[1:]
        check, text = self._smi(args, "smi-query")
        if text is not None:
            readings = parse_smi_csv(text)
            check.files.append(self._write("smi_query.parsed.json", {k: asdict(v) for k, v in readings.items()}))
            check.detail = f"{len(readings)} GPUs read by the heartbeat's query ({' '.join(args)})"
        return check

    def smi_xml(self) -> Check:
        return self._smi(list(SMI_READ_ONLY[0]), "smi-xml")[0]

    def smi_topo(self) -> Check:
        return self._smi(list(SMI_READ_ONLY[1]), "smi-topo")[0]

    def nvml(self) -> tuple[Check, list]:
        inv = NvmlInventory(self.cfg.nvml).read()
        files = [self._write("nvml_inventory.json", {"message": inv.message,
                                                     "gpus": [g.model_dump() for g in inv.gpus]})]
        if inv.gpus:
            return Check("nvml", "ok", inv.message, files), inv.gpus
        absent = "unavailable" in inv.message or "no NVIDIA GPUs" in inv.message
        return Check("nvml", "absent" if absent else "failed", inv.message, files), []

    def sysfs(self) -> tuple[Check, list[str]]:
        root = self.cfg.sysfs_root
        functions = nvidia_functions(root)
        files = [self._write("sysfs_functions.json", [asdict(f) for f in functions])]
        for fn in functions:
            device = root / "bus/pci/devices" / fn.bdf
            raw = {a: _read(device / a) for a in SYSFS_ATTRS if (device / a).exists()}
            raw |= {f"{a}->": link_name(device / a) for a in SYSFS_LINKS}
            files.append(self._write(f"sysfs/{fn.bdf}.json", raw))
        proc = self.cfg.proc_root / "driver/nvidia"
        for path in sorted(proc.rglob("*")) if proc.is_dir() else []:
            if path.is_file() and (path.name in ("version", "information", "params", "registry")):
                files.append(self._write(f"proc_driver_nvidia/{path.relative_to(proc)}", _read(path)))
        host = HostInventory(NvmlInventory(self.cfg.nvml), root, state_file=None).read()
        files.append(self._write("host_inventory.json", {"message": host.message, "nvswitches": host.nvswitches,
                                                         "gpus": [g.model_dump() for g in host.gpus]}))
        gpus = [f.bdf for f in functions if f.is_gpu]
        if not functions:
            return Check("sysfs", "absent", f"no NVIDIA GPU or NVSwitch function under {root}/bus/pci/devices",
                         files), []
        return Check("sysfs", "ok", f"{len(gpus)} GPU functions, {len(functions) - len(gpus)} NVSwitches; "
                                    f"inventory: {host.message}", files), gpus

    def holders(self, gpus: list[str]) -> Check:
        if not gpus:
            return Check("holders", "absent", "no GPU to scan")
        kernel = _NoWrites(self.cfg.sysfs_root, self.cfg.proc_root)
        found = {bdf: {"nodes": sorted(device_nodes(self.cfg.sysfs_root, self.cfg.proc_root, bdf)),
                       "holders": kernel.holders(bdf)} for bdf in gpus}
        held = sum(1 for v in found.values() if v["holders"])
        return Check("holders", "ok", f"{held} of {len(gpus)} GPUs held open", [self._write("holders.json", found)])

    def vfio_plan(self, gpus: list[str]) -> Check:
        if not gpus:
            return Check("vfio-plan", "absent", "no GPU to plan for")
        binder = VfioBinder(self.cfg.sysfs_root, kernel=_NoWrites(self.cfg.sysfs_root, self.cfg.proc_root),
                            proc_root=self.cfg.proc_root)
        plans, refused = {}, 0
        for bdf in gpus:
            try:
                facts, bind, release = binder.preview(bdf)
            except Exception as exc:  # noqa: BLE001 - one unreadable GPU is reported, the others still are
                plans[bdf] = {"error": f"{type(exc).__name__}: {exc}"}
                refused += 1
                continue
            refused += bool(bind.refusal)
            plans[bdf] = {"facts": asdict(facts), "bind": asdict(bind), "release": asdict(release)}
        return Check("vfio-plan", "ok", f"{len(gpus) - refused} of {len(gpus)} GPUs would bind (nothing applied)",
                     [self._write("vfio_plans.json", plans)])

    def cuda(self) -> Check:
        try:
            lib = ctypes.CDLL(self.cfg.libcuda)
        except OSError as exc:
            return Check("cuda", "absent", f"{self.cfg.libcuda} not loadable: {exc}")
        result: dict[str, Any] = {"cuInit": int(lib.cuInit(ctypes.c_uint(0)))}
        version, count = ctypes.c_int(0), ctypes.c_int(0)
        if result["cuInit"] == 0:
            result["cuDriverGetVersion"] = int(lib.cuDriverGetVersion(ctypes.byref(version)))
            result["driver_version"] = version.value
            result["cuDeviceGetCount"] = int(lib.cuDeviceGetCount(ctypes.byref(count)))
            result["devices"] = count.value
        files = [self._write("cuda.json", result)]
        if result["cuInit"] != 0:
            # 100 CUDA_ERROR_NO_DEVICE; 802 system not yet initialized (HGX without fabric manager)
            return Check("cuda", "failed", f"cuInit(0) returned {result['cuInit']}", files)
        return Check("cuda", "ok", f"cuInit ok, driver API {version.value}, {count.value} devices", files)

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> dict:
        gpus: list[str] = []
        steps: list[tuple[str, Callable[[], Check]]] = [
            ("smi-query", self.smi_query), ("smi-xml", self.smi_xml), ("smi-topo", self.smi_topo),
            ("nvml", lambda: self.nvml()[0]), ("sysfs", self._sysfs_and_remember(gpus)),
            ("holders", lambda: self.holders(gpus)), ("vfio-plan", lambda: self.vfio_plan(gpus)),
            ("cuda", self.cuda),
        ]
        for name, step in steps:
            if self._left() <= 0:
                self.checks.append(Check(name, "skipped", f"past the {self.cfg.deadline_s:g}s deadline"))
                continue
            try:
                self.checks.append(step())
            except Exception as exc:  # noqa: BLE001 - a broken check is reported; the rest still run
                self.checks.append(Check(name, "failed", f"{type(exc).__name__}: {exc}"))
        failed = [c.name for c in self.checks if c.status in ("failed", "skipped")]
        no_gpu = all(c.status == "absent" for c in self.checks)
        verdict = "no GPU" if no_gpu else ("problems: " + ", ".join(failed) if failed else "ok")
        summary = {"verdict": verdict, "gpus": len(gpus), "host": os.uname().nodename,
                   "seconds": round(self.clock() - self.started, 1), "checks": [asdict(c) for c in self.checks]}
        self._write("summary.json", summary)
        return summary

    def _sysfs_and_remember(self, gpus: list[str]) -> Callable[[], Check]:
        def step() -> Check:
            check, found = self.sysfs()
            gpus.extend(found)
            return check
        return step


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError as exc:
        return f"<unreadable: {exc.strerror or exc}>"
