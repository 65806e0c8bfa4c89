"""Bind a GPU (and everything in its IOMMU group) to vfio-pci, and give it back.

Bind, per non-bridge function of the GPU's IOMMU group (a GPU's HDMI audio function
must move too, or VFIO refuses the group; PCI bridges, class 0x0604, stay):
    write "vfio-pci" to driver_override, unbind from the current driver, drivers_probe.
Release writes an empty driver_override, unbinds from vfio-pci and reprobes, so the
kernel matches the device's own driver again (nvidia, snd_hda_intel).

Refusals (common.errors.Refused, never a half-done guess): no IOMMU groups on the host
(IOMMU off in firmware or kernel cmdline), SR-IOV virtual functions enabled on a
function, a process still holding a function after `hold_wait_s`, and a kernel write
that once did not finish within `timeout_s`. A stuck write usually means a driver is
wedged in the kernel; writing again can hang another thread or worse, so it is recorded
(in `state_dir` when given, so a restart remembers) and every later bind/release of that
group is refused until an operator calls clear_stuck(). Both directions are idempotent.

The sysfs root is configurable and all writes go through a KernelIO, so tests and the lab
run this exact code against agent.hw.sysfs_fake, a tree that reacts to writes like the kernel.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from common.errors import NotFound, Refused

log = logging.getLogger(__name__)

VFIO_DRIVER = "vfio-pci"
BRIDGE_CLASS_PREFIX = "0x0604"


class KernelIO(Protocol):
    """The two things the binder needs from the kernel besides reading files."""

    def write(self, path: Path, value: str) -> None: ...

    def holders(self, bdf: str) -> list[str]:
        """Who holds the device open, as 'pid N (comm)' strings; empty when free."""
        ...


class LinuxKernelIO:
    """The real kernel: plain sysfs writes; holders found through /proc/*/fd.

    A device is held when a process has its VFIO group (/dev/vfio/N, e.g. a QEMU still
    running) or an NVIDIA device node open (CUDA work, nvidia-persistenced). We cannot map
    /dev/nvidiaN to one GPU cheaply, so any open /dev/nvidia[0-9]* counts for NVIDIA-bound
    GPUs: conservative, and the bounded wait keeps it from blocking forever.
    """

    def __init__(self, sysfs_root: Path = Path("/sys"), proc_root: Path = Path("/proc")):
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root

    def write(self, path: Path, value: str) -> None:
        with open(path, "w") as handle:
            handle.write(value)

    def holders(self, bdf: str) -> list[str]:
        device = self.sysfs_root / "bus/pci/devices" / bdf
        targets: set[str] = set()
        group = _link_name(device / "iommu_group")
        if group:
            targets.add(f"/dev/vfio/{group}")
        if _link_name(device / "driver") == "nvidia":
            targets.add("/dev/nvidia")
        found = []
        for proc in self.proc_root.glob("[0-9]*"):
            try:
                for fd in (proc / "fd").iterdir():
                    target = os.readlink(fd)
                    if target in targets or (
                        "/dev/nvidia" in targets
                        and target[11:12].isdigit()
                        and target.startswith("/dev/nvidia")
                    ):
                        comm = (proc / "comm").read_text().strip()
                        found.append(f"pid {proc.name} ({comm})")
                        break
            except OSError:
                continue  # the process went away or is not ours to read
        return found


@dataclass
class BindResult:
    bdf: str
    functions: list[str]
    original_drivers: dict[str, str]  # bind: driver each function had; release: driver it returned to
    message: str


@dataclass(frozen=True)
class FunctionFacts:
    bdf: str
    driver: str  # "none" when unbound
    override: str  # "" when unset
    pci_class: str
    sriov_numvfs: int


@dataclass(frozen=True)
class GroupFacts:
    bdf: str
    group: str | None
    host_has_groups: bool
    vfio_driver_present: bool
    functions: list[FunctionFacts] = field(default_factory=list)


@dataclass(frozen=True)
class Write:
    path: str  # relative to the sysfs root
    value: str


@dataclass(frozen=True)
class FunctionPlan:
    bdf: str
    needs_free: bool  # must have no holders before its unbind
    writes: list[Write]


@dataclass(frozen=True)
class Plan:
    functions: list[str]
    steps: list[FunctionPlan]
    refusal: str | None = None


def _moving(facts: GroupFacts) -> tuple[list[FunctionFacts], str | None]:
    """The group's functions that change driver (bridges stay) and why the group may not move."""
    moving = [f for f in facts.functions if not f.pci_class.startswith(BRIDGE_CLASS_PREFIX)]
    return moving, _common_refusal(facts)


def plan_bind(facts: GroupFacts) -> Plan:
    """Pure: what to write to move the group to vfio-pci (empty steps when already there)."""
    moving, refusal = _moving(facts)
    names = [f.bdf for f in moving]
    if refusal:
        return Plan(names, [], refusal)
    if not facts.vfio_driver_present:
        return Plan(names, [], "the vfio-pci driver is not loaded on this host (run: modprobe vfio-pci)")
    steps = []
    for fn in moving:
        if fn.driver == VFIO_DRIVER and fn.override == VFIO_DRIVER:
            continue
        writes = [Write(f"bus/pci/devices/{fn.bdf}/driver_override", VFIO_DRIVER)]
        if fn.driver not in ("none", VFIO_DRIVER):
            writes.append(Write(f"bus/pci/drivers/{fn.driver}/unbind", fn.bdf))
        if fn.driver != VFIO_DRIVER:
            writes.append(Write("bus/pci/drivers_probe", fn.bdf))
        steps.append(FunctionPlan(fn.bdf, fn.driver not in ("none", VFIO_DRIVER), writes))
    return Plan(names, steps)


def plan_release(facts: GroupFacts) -> Plan:
    """Pure: what to write so each function's own driver takes it back."""
    moving, refusal = _moving(facts)
    names = [f.bdf for f in moving]
    if refusal:
        return Plan(names, [], refusal)
    steps = []
    for fn in moving:
        if fn.driver not in (VFIO_DRIVER, "none") and fn.override != VFIO_DRIVER:
            continue  # already with its own driver
        writes = []
        if fn.override == VFIO_DRIVER:
            # An empty write clears driver_override (the kernel then shows "(null)").
            writes.append(Write(f"bus/pci/devices/{fn.bdf}/driver_override", "\n"))
        if fn.driver == VFIO_DRIVER:
            writes.append(Write(f"bus/pci/drivers/{VFIO_DRIVER}/unbind", fn.bdf))
        writes.append(Write("bus/pci/drivers_probe", fn.bdf))
        steps.append(FunctionPlan(fn.bdf, fn.driver == VFIO_DRIVER, writes))
    return Plan(names, steps)


def _common_refusal(facts: GroupFacts) -> str | None:
    if not facts.host_has_groups:
        return (
            "this host has no IOMMU groups: enable VT-d/AMD-Vi in firmware and boot with "
            "intel_iommu=on iommu=pt (or amd_iommu=on)"
        )
    if facts.group is None:
        return f"{facts.bdf} is in no IOMMU group, so it cannot be given to a VM"
    for fn in facts.functions:
        if fn.sriov_numvfs > 0:
            return (
                f"{fn.bdf} has {fn.sriov_numvfs} SR-IOV virtual functions enabled; "
                "disable them (echo 0 > sriov_numvfs) before passing the whole device through"
            )
    return None


class VfioBinder:
    def __init__(
        self,
        sysfs_root: Path = Path("/sys"),
        timeout_s: float = 10,
        hold_wait_s: float = 5,
        *,
        kernel: KernelIO | None = None,
        state_dir: Path | None = None,
        poll_s: float = 0.1,
    ):
        self.root = Path(sysfs_root)
        self.timeout_s = timeout_s
        self.hold_wait_s = hold_wait_s
        self.kernel = kernel or LinuxKernelIO(self.root)
        self.state_dir = state_dir
        self.poll_s = poll_s
        self._stuck_memory: dict[str, str] = {}
        self._lock = threading.Lock()  # one bind/release at a time per binder

    # -- public API ---------------------------------------------------------

    def status(self, bdf: str) -> str:
        device = self._device(bdf)
        return _link_name(device / "driver") or "none"

    def bind(self, bdf: str) -> BindResult:
        with self._lock:
            facts = self._facts(bdf)
            plan = plan_bind(facts)
            originals = {f.bdf: f.driver for f in facts.functions if f.bdf in plan.functions}
            self._apply(bdf, plan, "bind")
            for fn in plan.functions:
                if self.status(fn) != VFIO_DRIVER:
                    raise Refused(f"{fn} did not bind to vfio-pci (driver now: {self.status(fn)})")
            message = (
                f"bound {', '.join(plan.functions)} to vfio-pci"
                if plan.steps
                else f"{bdf} already bound to vfio-pci"
            )
            return BindResult(bdf, plan.functions, originals, message)

    def release(self, bdf: str) -> BindResult:
        with self._lock:
            facts = self._facts(bdf)
            plan = plan_release(facts)
            self._apply(bdf, plan, "release")
            now = {fn: self.status(fn) for fn in plan.functions}
            still = [fn for fn, drv in now.items() if drv == VFIO_DRIVER]
            if still:
                raise Refused(f"{', '.join(still)} stayed on vfio-pci after release")
            message = (
                f"released {', '.join(plan.functions)} to their own drivers"
                if plan.steps
                else f"{bdf} was not bound to vfio-pci"
            )
            return BindResult(bdf, plan.functions, now, message)

    def stuck(self) -> dict[str, str]:
        """Recorded stuck writes: function address -> what was being written."""
        records = dict(self._stuck_memory)
        if self.state_dir and self.state_dir.is_dir():
            for path in self.state_dir.glob("stuck-*.json"):
                data = json.loads(path.read_text())
                records[data["bdf"]] = data["write"]
        return records

    def clear_stuck(self, bdf: str) -> bool:
        """Operator action after checking the host (dmesg, lsof): allow writes again."""
        found = self._stuck_memory.pop(bdf, None) is not None
        if self.state_dir:
            path = self.state_dir / f"stuck-{bdf}.json"
            if path.exists():
                path.unlink()
                found = True
        return found

    # -- reading ------------------------------------------------------------

    def _device(self, bdf: str) -> Path:
        device = self.root / "bus/pci/devices" / bdf
        if not device.exists():
            raise NotFound(f"no PCI device {bdf} on this host")
        return device

    def _facts(self, bdf: str) -> GroupFacts:
        device = self._device(bdf)
        groups_dir = self.root / "kernel/iommu_groups"
        host_has_groups = groups_dir.is_dir() and any(groups_dir.iterdir())
        group = _link_name(device / "iommu_group")
        members = [bdf]
        if group and host_has_groups:
            members = sorted(p.name for p in (groups_dir / group / "devices").iterdir())
        functions = [self._function(m) for m in members]
        return GroupFacts(
            bdf=bdf,
            group=group,
            host_has_groups=host_has_groups,
            vfio_driver_present=(self.root / "bus/pci/drivers" / VFIO_DRIVER).is_dir(),
            functions=functions,
        )

    def _function(self, bdf: str) -> FunctionFacts:
        device = self.root / "bus/pci/devices" / bdf
        override = _read(device / "driver_override")
        numvfs = _read(device / "sriov_numvfs")
        return FunctionFacts(
            bdf=bdf,
            driver=_link_name(device / "driver") or "none",
            override="" if override in ("", "(null)") else override,
            pci_class=_read(device / "class"),
            sriov_numvfs=int(numvfs) if numvfs.isdigit() else 0,
        )

    # -- applying -----------------------------------------------------------

    def _apply(self, bdf: str, plan: Plan, action: str) -> None:
        if plan.refusal:
            raise Refused(f"cannot {action} {bdf}: {plan.refusal}")
        stuck = {fn: w for fn, w in self.stuck().items() if fn in plan.functions}
        if stuck:
            fn, what = next(iter(stuck.items()))
            raise Refused(
                f"cannot {action} {bdf}: an earlier kernel write for {fn} ({what}) never finished; "
                "check the host (dmesg, lsof /dev/vfio/*) and clear it with the operator command before retrying"
            )
        # Check every function is free before the first write so a held device leaves nothing half-moved.
        for step in plan.steps:
            if step.needs_free:
                self._wait_free(step.bdf, action, bdf)
        for step in plan.steps:
            for write in step.writes:
                self._write(step.bdf, write)

    def _wait_free(self, fn: str, action: str, bdf: str) -> None:
        deadline_polls = max(1, int(self.hold_wait_s / self.poll_s))
        holders = self.kernel.holders(fn)
        for _ in range(deadline_polls):
            if not holders:
                return
            threading.Event().wait(self.poll_s)
            holders = self.kernel.holders(fn)
        if holders:
            raise Refused(
                f"cannot {action} {bdf}: {fn} is still in use by {', '.join(holders)} "
                f"after waiting {self.hold_wait_s:g}s; stop it first"
            )

    def _write(self, fn: str, write: Write) -> None:
        path = self.root / write.path
        # Stays an error unless the write returns; an unexpected exception in the worker counts as failure.
        outcome: dict[str, Exception | None] = {"error": RuntimeError("the write raised unexpectedly")}

        def run() -> None:
            try:
                self.kernel.write(path, write.value)
                outcome["error"] = None
            except OSError as exc:  # what sysfs writes raise; handed to the caller's thread below
                outcome["error"] = exc

        # A daemon thread per write: a write stuck in the kernel keeps its thread, never ours.
        worker = threading.Thread(target=run, name=f"sysfs-write-{fn}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            what = f"{write.value.strip() or '(empty)'} > {write.path}"
            self._record_stuck(fn, what)
            raise Refused(
                f"kernel write '{what}' did not finish within {self.timeout_s:g}s; recorded as stuck, "
                "no further writes to this device until an operator clears it"
            )
        error = outcome.get("error")
        if error is not None:
            raise Refused(f"kernel refused '{write.value.strip() or '(empty)'} > {write.path}': {error}")

    def _record_stuck(self, fn: str, what: str) -> None:
        log.error("stuck sysfs write for %s: %s", fn, what)
        self._stuck_memory[fn] = what
        if self.state_dir:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            (self.state_dir / f"stuck-{fn}.json").write_text(json.dumps({"bdf": fn, "write": what}))


def _link_name(path: Path) -> str | None:
    try:
        return Path(os.readlink(path)).name
    except OSError:
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
