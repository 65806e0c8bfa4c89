"""Bind a GPU (and everything in its IOMMU group) to vfio-pci, and give it back.

Bind, per non-bridge function of the GPU's IOMMU group (a GPU's HDMI audio function
must move too, or VFIO refuses the group; PCI bridges, class 0x0604, stay):
    write "vfio-pci" to driver_override, unbind from the current driver, drivers_probe.
Before the first write, persistence mode is turned off for each nvidia-bound GPU
(`nvidia-smi -i BDF -pm 0`, agent.hw.gpu_holders) so nvidia-persistenced lets go; holders are
found per GPU (its /dev/nvidiaN, /dev/dri nodes, /dev/vfio/N), never "any NVIDIA user".
Release writes an empty driver_override, unbinds from vfio-pci and reprobes, so the
kernel matches the device's own driver again (nvidia, snd_hda_intel), turns persistence back
on where we turned it off, and checks the functions' health (present, config space readable,
on the expected driver, nvidia initialised it). Release means "no longer ours", not
"back on nvidia": on a host booted with `vfio-pci.ids=` those ids stay on vfio-pci (only our
override is cleared), and with keep_bound (FABRIC_VFIO_KEEP_BOUND=1) GPUs stay bound between
VMs instead of bouncing through the host driver.

A group that holds a non-NVIDIA device other than a PCI bridge (a NIC or NVMe behind a PCIe
switch without ACS) is refused with the group's members listed: moving it would take that
device from the host.

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
import threading
from pathlib import Path
from typing import Any, Protocol

from agent.hw.gpu_holders import GpuDaemons, LinuxKernelIO, holder_hints
from agent.hw.pci_sysfs import link_name, read_attr
from agent.hw.vfio_plan import (  # noqa: F401 - re-exported: callers import the plan types from here
    VFIO_DRIVER,
    BindResult,
    FunctionFacts,
    FunctionPlan,
    GroupFacts,
    Plan,
    Write,
    plan_bind,
    plan_release,
    read_vfio_ids,
)
from common.errors import NotFound, Refused

log = logging.getLogger(__name__)



class GpuBinder(Protocol):
    """What the agent binds GPUs with (VfioBinder; fakes in tests): AgentState.binder, the libvirt driver."""

    def bind(self, bdf: str) -> Any: ...

    def release(self, bdf: str) -> Any: ...

    def status(self, bdf: str) -> Any: ...


class KernelIO(Protocol):
    """The two things the binder needs from the kernel besides reading files."""

    def write(self, path: Path, value: str) -> None: ...

    def holders(self, bdf: str) -> list[str]:
        """Who holds the device open, as 'pid N (comm)' strings; empty when free."""
        ...


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
        daemons: GpuDaemons | None = None,
        vfio_ids: frozenset[str] | None = None,
        keep_bound: bool = False,
        proc_root: Path = Path("/proc"),
    ):
        self.root = Path(sysfs_root)
        self.timeout_s = timeout_s
        self.hold_wait_s = hold_wait_s
        self.kernel = kernel or LinuxKernelIO(self.root, Path(proc_root))
        self.state_dir = state_dir
        self.poll_s = poll_s
        self.daemons = daemons
        self.proc_root = Path(proc_root)
        self.vfio_ids = vfio_ids if vfio_ids is not None else read_vfio_ids(self.proc_root)
        self.keep_bound = keep_bound
        self._persistence_off: set[str] = set()
        self._pm_problems: dict[str, str] = {}  # bdf -> why persistence could not be turned off
        self._stuck_memory: dict[str, str] = {}
        self._lock = threading.Lock()  # one bind/release at a time per binder

    # -- public API ---------------------------------------------------------

    def status(self, bdf: str) -> str:
        device = self._device(bdf)
        return link_name(device / "driver") or "none"

    def preview(self, bdf: str) -> tuple[GroupFacts, Plan, Plan]:
        """The group as read now and the bind and release plans for it, applying nothing (no
        write, no persistence change): what scripts/devcheck-gpu-host reports."""
        facts = self._facts(bdf)
        return facts, plan_bind(facts), plan_release(facts)

    def bind(self, bdf: str) -> BindResult:
        with self._lock:
            facts = self._facts(bdf)
            plan = plan_bind(facts)
            originals = {f.bdf: f.driver for f in facts.functions if f.bdf in plan.functions}
            if not plan.refusal:
                self._persistence_down(facts, plan)
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
            expected = {f.bdf: self._expected_after_release(f) for f in facts.functions if f.bdf in now}
            still = [fn for fn, drv in now.items() if drv == VFIO_DRIVER and expected[fn] != VFIO_DRIVER]
            if still:
                raise Refused(f"{', '.join(still)} stayed on vfio-pci after release")
            self._persistence_up(now)
            was_bound = any(f.driver == VFIO_DRIVER or f.override == VFIO_DRIVER
                            for f in facts.functions if f.bdf in now)
            if not was_bound:
                message = f"{bdf} was not bound to vfio-pci"
            elif facts.keep_bound:
                message = f"kept {', '.join(plan.functions)} on vfio-pci for the next VM (FABRIC_VFIO_KEEP_BOUND=1)"
            elif any(expected[fn] == VFIO_DRIVER for fn in now):
                ids = sorted({f.pci_id for f in facts.functions if f.pci_id in self.vfio_ids})
                message = (f"released {', '.join(plan.functions)}: {', '.join(ids)} stay on vfio-pci "
                           "(this host assigns them to vfio-pci with vfio-pci.ids=)")
            else:
                message = f"released {', '.join(plan.functions)} to their own drivers"
            problems = self.health(plan.functions, expected)
            if problems:
                log.error("post-release health check for %s: %s", bdf, problems)
                message += f"; health check failed: {problems}"
            return BindResult(bdf, plan.functions, now, message)

    def health(self, functions: list[str], expected: dict[str, str]) -> str:
        """Empty when every function is present, readable, on its expected driver, free of
        holders where it stays on vfio-pci, and (for nvidia) initialised; else what is wrong."""
        problems = []
        for fn in functions:
            device = self.root / "bus/pci/devices" / fn
            vendor = read_attr(device / "vendor").lower()
            if not device.exists() or vendor in ("", "0xffff"):
                problems.append(f"{fn} does not answer on the bus (config space reads {vendor or 'nothing'})")
                continue
            driver = self.status(fn)
            if expected.get(fn) and driver != expected[fn]:
                problems.append(f"{fn} is on {driver}, expected {expected[fn]}")
            elif driver == "nvidia" and not (self.proc_root / "driver/nvidia/gpus" / fn / "information").exists():
                problems.append(f"{fn} is bound to nvidia but the driver did not initialise it")
            elif driver == VFIO_DRIVER and self.kernel.holders(fn):
                problems.append(f"{fn} is still held by {', '.join(self.kernel.holders(fn))}")
        return "; ".join(problems)

    def _expected_after_release(self, fn: FunctionFacts) -> str:
        if self.keep_bound or fn.pci_id in self.vfio_ids:
            return VFIO_DRIVER if fn.driver == VFIO_DRIVER else fn.driver
        if fn.driver == VFIO_DRIVER or fn.override == VFIO_DRIVER:
            return ""  # whatever its own driver is; checked by "not on vfio-pci" above
        return fn.driver

    def _persistence_down(self, facts: GroupFacts, plan: Plan) -> None:
        if self.daemons is None:
            return
        for step in plan.steps:
            fn = next(f for f in facts.functions if f.bdf == step.bdf)
            if fn.driver == "nvidia" and fn.pci_class.startswith("0x03"):
                problem = self.daemons.set_persistence(fn.bdf, False)
                if problem:
                    log.warning("could not disable persistence on %s: %s", fn.bdf, problem)
                    self._pm_problems[fn.bdf] = problem
                else:
                    self._pm_problems.pop(fn.bdf, None)
                    self._persistence_off.add(fn.bdf)

    def _persistence_up(self, now: dict[str, str]) -> None:
        for fn, driver in now.items():
            if fn in self._persistence_off and driver == "nvidia" and self.daemons is not None:
                self._persistence_off.discard(fn)
                problem = self.daemons.set_persistence(fn, True)
                if problem:
                    log.warning("could not re-enable persistence on %s: %s", fn, problem)

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
        group = link_name(device / "iommu_group")
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
            vfio_ids=self.vfio_ids,
            keep_bound=self.keep_bound,
        )

    def _function(self, bdf: str) -> FunctionFacts:
        device = self.root / "bus/pci/devices" / bdf
        override = read_attr(device / "driver_override")
        numvfs = read_attr(device / "sriov_numvfs")
        return FunctionFacts(
            bdf=bdf,
            driver=link_name(device / "driver") or "none",
            override="" if override in ("", "(null)") else override,
            pci_class=read_attr(device / "class"),
            sriov_numvfs=int(numvfs) if numvfs.isdigit() else 0,
            vendor=read_attr(device / "vendor").lower(),
            device=read_attr(device / "device").lower(),
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
            pm = " after persistence mode was disabled for it (nvidia-smi -i BDF -pm 0)" if (
                fn in self._persistence_off) else ""
            if fn in self._pm_problems:
                pm = f" (persistence mode could not be disabled: {self._pm_problems[fn]})"
            hints = holder_hints(holders)
            raise Refused(
                f"cannot {action} {bdf}: {fn} is still in use by {', '.join(holders)}{pm} "
                f"after waiting {self.hold_wait_s:g}s; stop it first" + (f" ({hints})" if hints else "")
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
