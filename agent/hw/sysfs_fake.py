"""A fake /sys on disk that reacts to writes the way the PCI core does.

The tree has the same paths the binder reads on a real host:
    bus/pci/devices/<bdf>/{class,vendor,device,driver_override,driver->,iommu_group->,sriov_numvfs}
    bus/pci/drivers/<name>/{bind,unbind}
    bus/pci/drivers_probe
    kernel/iommu_groups/<n>/devices/<bdf> -> device
Writes go through FakeKernel.write (the KernelIO the binder uses), which updates the
file and then does what the kernel would: unbind removes the `driver` link, drivers_probe
binds the override driver if one is set, else the device's own driver, bind checks the
override. Unbinding a device a process holds blocks, as it does on Linux (vfio-pci waits
for the user to let go). Tests and the lab build hosts with it:

    fake = FakeSysfs(tmp_path)
    fake.add_gpu("0000:3b:00.0", group=12, audio=True, bridge="0000:3a:00.0")
    binder = VfioBinder(fake.root, kernel=fake.kernel)

Simulations: hold(bdf, who) / let_go(bdf), stick(path_suffix) to make writes to a path
block until unstick(), and set_sriov(bdf, n).
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

GPU_CLASS = "0x030200"  # 3D controller (H100/H200 report this)
VGA_CLASS = "0x030000"
AUDIO_CLASS = "0x040300"
BRIDGE_CLASS = "0x060400"
NVIDIA_VENDOR = "0x10de"

DEFAULT_DRIVERS = ("nvidia", "snd_hda_intel", "pcieport", "vfio-pci", "ast")


@dataclass
class FakeKernel:
    """The KernelIO for a FakeSysfs tree."""

    sysfs: FakeSysfs

    def write(self, path: Path, value: str) -> None:
        self.sysfs.write(path, value)

    def holders(self, bdf: str) -> list[str]:
        return list(self.sysfs.held.get(bdf, []))


@dataclass
class FakeSysfs:
    root: Path
    native: dict[str, str] = field(default_factory=dict)  # bdf -> the driver its id table matches
    held: dict[str, list[str]] = field(default_factory=dict)
    _stuck: dict[str, threading.Event] = field(default_factory=dict)
    _released: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        (self.root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (self.root / "kernel/iommu_groups").mkdir(parents=True, exist_ok=True)
        (self.root / "bus/pci/drivers_probe").touch()
        for name in DEFAULT_DRIVERS:
            self.add_driver(name)

    @property
    def kernel(self) -> FakeKernel:
        return FakeKernel(self)

    # -- building a host ----------------------------------------------------

    def add_driver(self, name: str) -> None:
        drv = self.root / "bus/pci/drivers" / name
        drv.mkdir(parents=True, exist_ok=True)
        for attr in ("bind", "unbind", "new_id"):
            (drv / attr).touch()

    def remove_driver(self, name: str) -> None:
        drv = self.root / "bus/pci/drivers" / name
        for child in drv.iterdir():
            child.unlink()
        drv.rmdir()

    def add_device(
        self,
        bdf: str,
        *,
        pci_class: str,
        driver: str | None,
        group: int | None,
        vendor: str = NVIDIA_VENDOR,
        device_id: str = "0x2330",
        sriov_total: int = 0,
    ) -> None:
        dev = self.root / "bus/pci/devices" / bdf
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "class").write_text(pci_class + "\n")
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "device").write_text(device_id + "\n")
        (dev / "driver_override").write_text("(null)\n")
        if sriov_total:
            (dev / "sriov_totalvfs").write_text(f"{sriov_total}\n")
            (dev / "sriov_numvfs").write_text("0\n")
        if driver:
            self.native[bdf] = driver
            self._link_driver(bdf, driver)
        if group is not None:
            gdir = self.root / "kernel/iommu_groups" / str(group) / "devices"
            gdir.mkdir(parents=True, exist_ok=True)
            (gdir / bdf).symlink_to(dev)
            (dev / "iommu_group").symlink_to(self.root / "kernel/iommu_groups" / str(group))

    def add_gpu(
        self,
        bdf: str,
        *,
        group: int | None,
        audio: bool = False,
        bridge: str | None = None,
        driver: str = "nvidia",
        sriov_total: int = 0,
    ) -> None:
        """A GPU as its own function 0, optionally with an HDMI audio function .1 and an
        upstream PCIe bridge in the same IOMMU group (as on boards without ACS)."""
        self.add_device(bdf, pci_class=GPU_CLASS, driver=driver, group=group, sriov_total=sriov_total)
        if audio:
            self.add_device(bdf[:-1] + "1", pci_class=AUDIO_CLASS, driver="snd_hda_intel", group=group)
        if bridge:
            self.add_device(
                bridge,
                pci_class=BRIDGE_CLASS,
                driver="pcieport",
                group=group,
                vendor="0x8086",
                device_id="0x347a",
            )

    # -- simulations --------------------------------------------------------

    def hold(self, bdf: str, who: str = "pid 4242 (qemu-system-x86)") -> None:
        with self._released:
            self.held.setdefault(bdf, []).append(who)

    def let_go(self, bdf: str) -> None:
        with self._released:
            self.held.pop(bdf, None)
            self._released.notify_all()

    def stick(self, path_suffix: str) -> threading.Event:
        """Writes to paths ending in path_suffix block until the returned event is set."""
        event = threading.Event()
        self._stuck[path_suffix] = event
        return event

    def unstick(self, path_suffix: str) -> None:
        event = self._stuck.pop(path_suffix, None)
        if event:
            event.set()

    def set_sriov(self, bdf: str, count: int) -> None:
        self.write(self.root / "bus/pci/devices" / bdf / "sriov_numvfs", str(count))

    def driver_of(self, bdf: str) -> str:
        try:
            return Path(os.readlink(self.root / "bus/pci/devices" / bdf / "driver")).name
        except OSError:
            return "none"

    # -- the kernel's side of a write ----------------------------------------

    def write(self, path: Path, value: str) -> None:
        path = Path(path)
        rel = path.relative_to(self.root).as_posix()
        for suffix, event in list(self._stuck.items()):
            if rel.endswith(suffix):
                event.wait(timeout=300)  # bounded so a forgotten test cannot hang a worker forever
        parts = rel.split("/")
        text = value.strip()
        if rel == "bus/pci/drivers_probe":
            self._probe(text)
        elif parts[:3] == ["bus", "pci", "drivers"] and len(parts) == 5 and parts[4] == "unbind":
            self._unbind(parts[3], text)
        elif parts[:3] == ["bus", "pci", "drivers"] and len(parts) == 5 and parts[4] == "bind":
            self._bind(parts[3], text)
        elif parts[:3] == ["bus", "pci", "devices"] and parts[-1] == "driver_override":
            path.write_text((text or "(null)") + "\n")
        elif parts[:3] == ["bus", "pci", "devices"] and parts[-1] == "sriov_numvfs":
            self._sriov(path.parent, int(text or "0"))
        else:
            raise OSError(errno.EACCES, f"fake sysfs: {rel} is not writable")

    def _device(self, bdf: str) -> Path:
        dev = self.root / "bus/pci/devices" / bdf
        if not dev.is_dir():
            raise OSError(errno.ENODEV, f"no such device {bdf}")
        return dev

    def _link_driver(self, bdf: str, driver: str) -> None:
        dev = self._device(bdf)
        drv = self.root / "bus/pci/drivers" / driver
        (dev / "driver").symlink_to(drv)
        (drv / bdf).symlink_to(dev)

    def _unbind(self, driver: str, bdf: str) -> None:
        if self.driver_of(bdf) != driver:
            raise OSError(errno.ENODEV, f"{bdf} is not bound to {driver}")
        with self._released:
            # Linux blocks the unbind until the holder lets go; so do we (bounded).
            self._released.wait_for(lambda: not self.held.get(bdf), timeout=300)
        (self._device(bdf) / "driver").unlink()
        (self.root / "bus/pci/drivers" / driver / bdf).unlink()

    def _bind(self, driver: str, bdf: str) -> None:
        dev = self._device(bdf)
        if self.driver_of(bdf) != "none":
            raise OSError(errno.EBUSY, f"{bdf} already has a driver")
        override = (dev / "driver_override").read_text().strip()
        if override not in ("(null)", driver):
            raise OSError(errno.ENODEV, f"{bdf} driver_override is {override}")
        self._link_driver(bdf, driver)

    def _probe(self, bdf: str) -> None:
        dev = self._device(bdf)
        if self.driver_of(bdf) != "none":
            return  # the kernel leaves a bound device alone
        override = (dev / "driver_override").read_text().strip()
        wanted = self.native.get(bdf) if override == "(null)" else override
        if wanted and (self.root / "bus/pci/drivers" / wanted).is_dir():
            self._link_driver(bdf, wanted)

    def _sriov(self, dev: Path, count: int) -> None:
        total = int((dev / "sriov_totalvfs").read_text()) if (dev / "sriov_totalvfs").exists() else 0
        if count > total:
            raise OSError(errno.ERANGE, f"{dev.name} supports at most {total} VFs")
        (dev / "sriov_numvfs").write_text(f"{count}\n")
        for link in dev.glob("virtfn*"):
            link.unlink()
        for i in range(count):
            (dev / f"virtfn{i}").symlink_to(dev)
