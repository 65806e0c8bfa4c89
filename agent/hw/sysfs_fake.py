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

What real GPU hosts have and the fake models (each a behaviour a test relies on):
- `numa_node` and `resource` (BAR sizes; H100 BAR1 128 GiB, H200 256 GiB, 64-bit flags);
- `proc/driver/nvidia/gpus/<bdf>/information` with the GPU's device minor while nvidia owns
  it, and `drm/cardN` + `renderDN` when `modeset=True` (nvidia_drm modeset=1);
- `persistenced()`: nvidia-persistenced holding every nvidia-bound GPU until persistence is
  disabled for that GPU (`FakeGpuDaemons.disable_persistence`, what `nvidia-smi -i BDF -pm 0`
  does); `hold(..., "pid N (nv-hostengine)")` is a holder that does not let go (DCGM);
- `add_foreign()`: a NIC or NVMe in a GPU's IOMMU group (a switch without ACS);
- `vfio_ids`: ids claimed by vfio-pci at probe (a host booted with `vfio-pci.ids=`);
- `add_nvswitch()`: HGX NVSwitch functions (class 0x0680, each in its own group);
- `lose(bdf)`: Xid 79, the GPU fell off the bus (config space reads 0xffff, no driver).
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

NVSWITCH_CLASS = "0x068000"
NIC_CLASS = "0x020000"
NVME_CLASS = "0x010802"
DEFAULT_DRIVERS = ("nvidia", "snd_hda_intel", "pcieport", "vfio-pci", "ast", "mlx5_core", "nvme", "nvidia-nvswitch")
GIB = 1 << 30
MEM64_PREF = 0x0014220C  # IORESOURCE_MEM | PREFETCH | MEM_64 | SIZEALIGN, as a 64-bit prefetchable BAR shows
MEM32 = 0x00040200
# BAR0 16 MiB registers, BAR1 (VRAM aperture), BAR3 32 MiB, per board (device id -> BAR1 GiB).
BAR1_GIB = {"0x2330": 128, "0x2335": 256, "0x20b2": 128, "0x27b8": 32}


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
    vfio_ids: set[str] = field(default_factory=set)  # "10de:2330": vfio-pci claims these at probe
    modeset: bool = False  # nvidia_drm modeset=1: nvidia-bound GPUs get /dev/dri nodes
    persistence: set[str] = field(default_factory=set)  # GPUs nvidia-persistenced holds open
    _minors: dict[str, int] = field(default_factory=dict)
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

    @property
    def proc(self) -> Path:
        """The fake /proc beside the tree (driver/nvidia/gpus/<bdf>/information)."""
        return self.root.parent / (self.root.name + "-proc")

    @property
    def daemons(self) -> FakeGpuDaemons:
        return FakeGpuDaemons(self)

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
        numa_node: int = -1,
        bars: tuple[tuple[int, int], ...] = (),  # (size bytes, flags) for BAR0.. in order
    ) -> None:
        dev = self.root / "bus/pci/devices" / bdf
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "class").write_text(pci_class + "\n")
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "device").write_text(device_id + "\n")
        (dev / "driver_override").write_text("(null)\n")
        (dev / "numa_node").write_text(f"{numa_node}\n")
        (dev / "resource").write_text(_resource_text(bars))
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
        device_id: str = "0x2330",
        numa_node: int = 0,
    ) -> None:
        """A GPU as its own function 0, optionally with an HDMI audio function .1 and an
        upstream PCIe bridge in the same IOMMU group (as on boards without ACS)."""
        bar1 = BAR1_GIB.get(device_id, 64) * GIB
        bars = ((16 << 20, MEM32), (bar1, MEM64_PREF), (0, 0), (32 << 20, MEM64_PREF))
        if ("10de:" + device_id.removeprefix("0x")) in self.vfio_ids:
            driver = "vfio-pci"  # claimed at boot, before nvidia loads
        self.add_device(bdf, pci_class=GPU_CLASS, driver=driver, group=group, sriov_total=sriov_total,
                        device_id=device_id, numa_node=numa_node, bars=bars)
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

    def add_nvswitch(self, bdf: str, *, group: int, numa_node: int = 0) -> None:
        """An HGX NVSwitch (H100/H200 boards have four), in its own IOMMU group."""
        self.add_device(bdf, pci_class=NVSWITCH_CLASS, driver="nvidia-nvswitch", group=group, device_id="0x22a3",
                        numa_node=numa_node, bars=((32 << 20, MEM64_PREF),))

    def add_foreign(self, bdf: str, *, group: int, kind: str = "nic") -> None:
        """A non-NVIDIA device sharing a GPU's IOMMU group (behind a PCIe switch without ACS)."""
        pci_class, driver, device = (NIC_CLASS, "mlx5_core", "0x101b") if kind == "nic" else (
            NVME_CLASS, "nvme", "0xa808")
        self.add_device(bdf, pci_class=pci_class, driver=driver, group=group,
                        vendor="0x15b3" if kind == "nic" else "0x144d", device_id=device)

    # -- simulations --------------------------------------------------------

    def persistenced(self) -> None:
        """nvidia-persistenced starts: it opens every nvidia-bound GPU and keeps it open."""
        for bdf, driver in list(self.native.items()):
            if self.driver_of(bdf) == "nvidia" and driver == "nvidia":
                self.persistence.add(bdf)
                self.hold(bdf, "pid 812 (nvidia-persiste)")

    def disable_persistence(self, bdf: str) -> None:
        if bdf in self.persistence:
            self.persistence.discard(bdf)
            with self._released:
                rest = [h for h in self.held.get(bdf, []) if "nvidia-persiste" not in h]
                if rest:
                    self.held[bdf] = rest
                else:
                    self.held.pop(bdf, None)
                self._released.notify_all()

    def lose(self, bdf: str) -> None:
        """Xid 79: the GPU fell off the bus. Config space reads all ones; the driver lets go."""
        dev = self._device(bdf)
        (dev / "vendor").write_text("0xffff\n")
        (dev / "device").write_text("0xffff\n")
        driver = self.driver_of(bdf)
        if driver != "none":
            (dev / "driver").unlink()
            (self.root / "bus/pci/drivers" / driver / bdf).unlink()
            self._driver_detached(bdf, driver)

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
        if driver == "nvidia":
            # The nvidia driver numbers GPUs as it binds them: /dev/nvidiaN.
            minor = self._minors.setdefault(bdf, len(self._minors))
            info = self.proc / "driver/nvidia/gpus" / bdf
            info.mkdir(parents=True, exist_ok=True)
            (info / "information").write_text(
                f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 130\nDevice Minor: \t {minor}\n"
                f"Bus Location: \t {bdf}\n")
            if self.modeset:
                (dev / "drm" / f"card{minor + 1}").mkdir(parents=True, exist_ok=True)
                (dev / "drm" / f"renderD{128 + minor}").mkdir(parents=True, exist_ok=True)

    def _driver_detached(self, bdf: str, driver: str) -> None:
        if driver == "nvidia":
            info = self.proc / "driver/nvidia/gpus" / bdf
            if info.is_dir():
                (info / "information").unlink()
                info.rmdir()
            drm = self._device(bdf) / "drm"
            if drm.is_dir():
                for child in drm.iterdir():
                    child.rmdir()
                drm.rmdir()

    def _unbind(self, driver: str, bdf: str) -> None:
        if self.driver_of(bdf) != driver:
            raise OSError(errno.ENODEV, f"{bdf} is not bound to {driver}")
        with self._released:
            # Linux blocks the unbind until the holder lets go; so do we (bounded).
            self._released.wait_for(lambda: not self.held.get(bdf), timeout=300)
        (self._device(bdf) / "driver").unlink()
        (self.root / "bus/pci/drivers" / driver / bdf).unlink()
        self._driver_detached(bdf, driver)

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
        pci_id = (dev / "vendor").read_text().strip()[2:] + ":" + (dev / "device").read_text().strip()[2:]
        if override == "(null)" and pci_id in self.vfio_ids:
            wanted = "vfio-pci"  # vfio-pci.ids= puts these ids in vfio-pci's match table
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


@dataclass
class FakeGpuDaemons:
    """The GpuDaemons the binder uses, for a FakeSysfs: `nvidia-smi -i BDF -pm 0|1`."""

    sysfs: FakeSysfs
    calls: list[str] = field(default_factory=list)

    def set_persistence(self, bdf: str, enabled: bool) -> str | None:
        self.calls.append(f"{bdf} -pm {int(enabled)}")
        if self.sysfs.driver_of(bdf) != "nvidia":
            return f"{bdf} is not on the nvidia driver"
        if enabled:
            self.sysfs.persistence.add(bdf)
            self.sysfs.hold(bdf, "pid 812 (nvidia-persiste)")
        else:
            self.sysfs.disable_persistence(bdf)
        return None


def _resource_text(bars: tuple[tuple[int, int], ...]) -> str:
    """A sysfs `resource` file: 13 lines of start end flags (6 BARs, ROM, bridge windows)."""
    lines, base = [], 0x2000_0000_0000
    for size, flags in bars:
        if size:
            lines.append(f"0x{base:016x} 0x{base + size - 1:016x} 0x{flags:016x}")
            base += max(size, 1 << 30)
        else:
            lines.append(f"0x{0:016x} 0x{0:016x} 0x{0:016x}")
    lines += [f"0x{0:016x} 0x{0:016x} 0x{0:016x}"] * (13 - len(lines))
    return "\n".join(lines) + "\n"
