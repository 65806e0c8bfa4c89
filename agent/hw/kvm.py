"""Whether this host's KVM really runs a guest with the CPU our GPU guests get.

A /dev/kvm that exists is not a KVM that works. Two ways it fails that we have met:
- a nested KVM that cannot take the host CPU model: QEMU aborts at start with
  `failed to set MSR 0x10a ...` / `kvm_buf_set_msrs: Assertion ... failed` (libvirt says
  "qemu unexpectedly closed the monitor");
- a PVM /dev/kvm (kvm-pvm) that runs only PVM-enabled guest kernels: the domain starts and QEMU
  pauses it at the first instruction KVM must emulate ("emulation failure").
- a KVM that starts a guest and runs its real-mode firmware but hangs a real kernel: a boot
  sector printed its marker, then the guests' kernel printed nothing for minutes.
So the probe boots a real kernel: a transient libvirt domain of the driver's shape (q35, the
driver's `<cpu>` element (add_cpu below), 256 MiB) booting a copy of this host's own
kernel (/boot/vmlinuz-`uname -r`, else the newest /boot/vmlinuz-*) directly with no root and no
initramfs. The guest ran only if the kernel's last words without a root ("VFS: Unable to mount
root fs") reach the serial log: it went through its whole init (long mode, paging, MSRs, APIC
timers, ACPI, PCI) on this KVM. Any other outcome is "not usable" with the reason QEMU, libvirt
or the guest's console gave. A host with no readable kernel in /boot falls back to a 1 MiB raw
disk whose boot sector writes a marker to COM1 and halts (SeaBIOS loads it), and the reason says
that only the firmware path was checked. The domain is transient (never defined) and named
outside the driver's `fabric-` prefix, so the driver's list() never sees it, and its files are
removed.

The verdict is kept per boot (`CachedKvmProbe`: keyed by /proc/sys/kernel/random/boot_id and
the libvirt URI), so a host probes once per boot whatever reads it (the heartbeat, every GPU VM
create). Callers hold a `KvmProbe`; tests hand in `FakeKvmProbe`. The agent reports the verdict
in its inventory and heartbeat and refuses a GPU VM on a host whose KVM does not work (never a
GPU guest under TCG: agent.vm.libvirt_driver).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

MARKER = b"FABRIC-KVM-PROBE-OK"
# A kernel booted with no root and no initramfs panics with this once its init is done.
KERNEL_DONE = b"Unable to mount root fs"
KERNEL_CMDLINE = "console=ttyS0 panic=0"  # panic=0: the guest hangs at the panic until destroyed
BOOT_DIR = Path("/boot")
# Bumped when what the probe boots changes: a verdict kept from another probe is not reused.
PROBE_VERSION = 2
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PROBE_PREFIX = "fabric_kvmprobe_"  # not the driver's "fabric-": LibvirtDriver.list() must not see it
QEMU_LOG_DIR = Path("/var/log/libvirt/qemu")


@dataclass(frozen=True)
class KvmState:
    usable: bool
    reason: str  # why not (or what ran), in words for an operator
    domain_type: str = "kvm"  # what was probed: kvm, or qemu (TCG) in tests of the probe itself
    checked_at: float = 0.0


class KvmProbe(Protocol):
    def state(self) -> KvmState: ...


class FakeKvmProbe:
    """A fixed verdict; counts how often it was asked (tests of callers)."""

    def __init__(self, usable: bool, reason: str = "fake"):
        self.verdict = KvmState(usable, reason)
        self.calls = 0

    def state(self) -> KvmState:
        self.calls += 1
        return self.verdict


def boot_sector(marker: bytes = MARKER) -> bytes:
    """A 512-byte MBR boot sector: write `marker` CRLF to COM1 (0x3f8), then halt forever.

    Real mode at 0000:7C00; DS is zeroed because the BIOS does not promise it."""
    code = bytes([
        0xFA,              # cli
        0xFC,              # cld (lodsb counts up)
        0x31, 0xC0,        # xor ax, ax
        0x8E, 0xD8,        # mov ds, ax
        0xBA, 0xF8, 0x03,  # mov dx, 0x3f8
        0xBE, 0x17, 0x7C,  # mov si, 0x7c17 (the message, right after these 23 bytes)
        0xAC,              # .loop: lodsb
        0x84, 0xC0,        # test al, al
        0x74, 0x03,        # jz .done
        0xEE,              # out dx, al
        0xEB, 0xF8,        # jmp .loop
        0xF4,              # .done: hlt
        0xEB, 0xFD,        # jmp .done
    ])
    assert len(code) == 0x17
    sector = code + marker + b"\r\n\0"
    if len(sector) > 510:
        raise ValueError("marker too long for one boot sector")
    return sector + b"\0" * (510 - len(sector)) + b"\x55\xaa"


def write_probe_disk(path: Path) -> None:
    """1 MiB raw disk (SeaBIOS will not boot a disk of a single sector) with the boot sector."""
    with open(path, "wb") as f:
        f.write(boot_sector())
        f.truncate(1 << 20)
    path.chmod(0o644)


def probe_kernel(boot_dir: Path = BOOT_DIR) -> Path | None:
    """The kernel the probe boots: this host's running one where /boot has it, else the newest."""
    running = boot_dir / f"vmlinuz-{os.uname().release}"
    others = sorted(boot_dir.glob("vmlinuz-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in [running, *others]:
        if path.is_file() and os.access(path, os.R_OK):
            return path
    return None


def add_cpu(dom: ET.Element, domain_type: str, vcpus: int = 1) -> ET.Element:
    """The guests' <cpu> element (agent.vm.domain_xml's guests and this probe boot the same one) with
    a topology: one socket of `vcpus` cores, one thread each (without it QEMU makes one socket per
    vCPU, and guests size per-socket caches and licences from that)."""
    if domain_type == "qemu":  # TCG has no host CPU to pass through; "maximum" is QEMU's -cpu max
        cpu = ET.SubElement(dom, "cpu", {"mode": "maximum", "check": "none"})
    else:
        cpu = ET.SubElement(dom, "cpu", {"mode": "host-passthrough", "check": "none", "migratable": "off"})
        ET.SubElement(cpu, "maxphysaddr", {"mode": "passthrough"})
    ET.SubElement(cpu, "topology", {"sockets": "1", "dies": "1", "cores": str(vcpus), "threads": "1"})
    return cpu


def probe_domain_xml(name: str, disk: Path | None, console_log: Path, domain_type: str = "kvm",
                     kernel: Path | None = None) -> str:
    """The probe guest: the driver's machine and <cpu> element, COM1 logged, and either `kernel`
    booted directly (no disk) or SeaBIOS booting `disk` (SATA)."""
    dom = ET.Element("domain", {"type": domain_type})
    ET.SubElement(dom, "name").text = name
    ET.SubElement(dom, "memory", {"unit": "KiB"}).text = str((256 if kernel else 64) * 1024)
    ET.SubElement(dom, "vcpu").text = "1"
    os_el = ET.SubElement(dom, "os")
    ET.SubElement(os_el, "type", {"arch": "x86_64", "machine": "q35"}).text = "hvm"
    if kernel is not None:
        ET.SubElement(os_el, "kernel").text = str(kernel)
        ET.SubElement(os_el, "cmdline").text = KERNEL_CMDLINE
    else:
        ET.SubElement(os_el, "boot", {"dev": "hd"})
    features = ET.SubElement(dom, "features")
    ET.SubElement(features, "acpi")
    ET.SubElement(features, "apic")
    add_cpu(dom, domain_type)
    ET.SubElement(dom, "on_poweroff").text = "destroy"
    ET.SubElement(dom, "on_crash").text = "destroy"
    ET.SubElement(dom, "on_reboot").text = "destroy"
    dev = ET.SubElement(dom, "devices")
    if kernel is None and disk is not None:
        disk_el = ET.SubElement(dev, "disk", {"type": "file", "device": "disk"})
        ET.SubElement(disk_el, "driver", {"name": "qemu", "type": "raw"})
        ET.SubElement(disk_el, "source", {"file": str(disk)})
        ET.SubElement(disk_el, "target", {"dev": "sda", "bus": "sata"})
    serial = ET.SubElement(dev, "serial", {"type": "pty"})
    ET.SubElement(serial, "log", {"file": str(console_log), "append": "off"})
    ET.SubElement(dev, "memballoon", {"model": "none"})
    return ET.tostring(dom, encoding="unicode")


class LibvirtKvmProbe:
    """Starts the probe guest on libvirt (`uri`) and reads its serial log.

    work_dir must be reachable by QEMU's user (libvirt-qemu): e.g. under /var/lib/libvirt/images
    or the driver's state directory. domain_type "qemu" probes TCG instead (tests of the probe)."""

    def __init__(self, uri: str = "qemu:///system", *, work_dir: Path, timeout_s: float = 60.0,
                 domain_type: str = "kvm", dev_kvm: Path = Path("/dev/kvm"), boot_dir: Path | None = BOOT_DIR):
        self.uri = uri
        self.work_dir = Path(work_dir)
        self.timeout_s = timeout_s
        self.domain_type = domain_type
        self.dev_kvm = Path(dev_kvm)
        self.boot_dir = boot_dir  # None: the boot-sector probe only (tests of it)

    def state(self) -> KvmState:
        now = time.time()
        if self.uri.startswith("test:"):
            return KvmState(True, "libvirt's test driver runs no guest: nothing to probe", self.domain_type, now)
        if self.domain_type == "kvm":
            why = self._device_problem()
            if why:
                return KvmState(False, why, self.domain_type, now)
        try:
            usable, reason = self._boot()
        except Exception as exc:  # noqa: BLE001 - any failure to run the probe is a "no", with its reason
            usable, reason = False, f"KVM probe could not run: {type(exc).__name__}: {exc}"
        return KvmState(usable, reason, self.domain_type, now)

    def _device_problem(self) -> str:
        if not self.dev_kvm.exists():
            return f"no {self.dev_kvm} (KVM module not loaded, or virtualization disabled in firmware)"
        try:
            fd = os.open(self.dev_kvm, os.O_RDWR)
        except OSError as exc:
            return f"cannot open {self.dev_kvm}: {exc.strerror}"
        os.close(fd)
        return ""

    def _boot(self) -> tuple[bool, str]:
        import libvirt

        name = f"{PROBE_PREFIX}{os.getpid()}_{threading.get_ident() % 100000}"
        work = self.work_dir / name
        shutil.rmtree(work, ignore_errors=True)
        if not self.work_dir.exists():  # QEMU (libvirt-qemu) must traverse it whatever our umask
            self.work_dir.mkdir(parents=True)
            self.work_dir.chmod(0o755)
        work.mkdir()
        work.chmod(0o755)
        console = work / "console.log"
        source = probe_kernel(self.boot_dir) if self.boot_dir is not None else None
        kernel = disk = None
        if source is not None:  # a copy: libvirt relabels what a guest boots, never the host's own file
            kernel = work / "vmlinuz"
            shutil.copyfile(source, kernel)
            kernel.chmod(0o644)
            done, ran = KERNEL_DONE, (f"a {self.domain_type} guest (q35, the guests' CPU model) booted this host's "
                                      f"kernel {source.name} through its init to the serial console")
        else:
            disk = work / "probe.img"
            write_probe_disk(disk)
            done, ran = MARKER, (f"a {self.domain_type} guest ran (q35, the guests' CPU model): its boot sector "
                                 f"wrote to the serial console (no kernel in {self.boot_dir}: only the firmware "
                                 f"path was checked)")
        libvirt.registerErrorHandler(lambda _c, _e: None, None)
        conn = libvirt.open(self.uri)
        dom = None
        try:
            try:
                dom = conn.createXML(probe_domain_xml(name, disk, console, self.domain_type, kernel), 0)
            except libvirt.libvirtError as exc:
                return False, (f"QEMU could not start a {self.domain_type} guest with the CPU model our guests use: "
                               f"{_one_line(exc.get_error_message())}")
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                text = _read(console)
                if done in text:
                    return True, ran
                panic = text.find(b"Kernel panic")
                if kernel is not None and panic >= 0 and b"\n" in text[panic:]:  # another panic, whole line read
                    return False, f"the probe guest's kernel panicked: {_last_line(text, b'Kernel panic')}"
                try:
                    state, reason = dom.state()
                except libvirt.libvirtError:
                    return False, f"the probe guest vanished: {_qemu_log_tail(name)}"
                if state == libvirt.VIR_DOMAIN_PAUSED:
                    tail = _qemu_log_tail(name)
                    what = "emulation failure" if "emulation failure" in tail else f"reason {reason}"
                    return False, (f"QEMU paused the probe guest ({what}): this KVM cannot run a stock guest "
                                   f"(a PVM or otherwise limited KVM?)")
                if state in (libvirt.VIR_DOMAIN_SHUTOFF, libvirt.VIR_DOMAIN_CRASHED):
                    return False, f"the probe guest stopped before it ran: {_qemu_log_tail(name)}"
                time.sleep(0.1)
            text = _read(console)
            if kernel is not None and text.strip():
                return False, (f"the probe guest's kernel did not finish its init in {self.timeout_s:.0f}s under "
                               f"{self.domain_type}; its console's last line: {_last_line(text)}")
            return False, f"the probe guest printed nothing in {self.timeout_s:.0f}s under {self.domain_type}"
        finally:
            if dom is not None:
                try:
                    dom.destroy()  # transient: destroy also removes its definition
                except libvirt.libvirtError:
                    pass
            conn.close()
            shutil.rmtree(work, ignore_errors=True)
            try:
                self.work_dir.rmdir()  # only when empty: a shared state directory stays
            except OSError:
                pass
            for leftover in QEMU_LOG_DIR.glob(f"{name}*.log"):
                leftover.unlink(missing_ok=True)


class CachedKvmProbe:
    """One verdict per boot: kept in memory and in `cache_file` (JSON, keyed by boot id + key).

    Concurrent processes wait on a lock beside the file, so a host probes once however many
    agents or test runs ask together."""

    def __init__(self, inner: KvmProbe, cache_file: Path, *, key: str = "", boot_id_file: Path = BOOT_ID):
        self.inner = inner
        self.cache_file = Path(cache_file)
        self.key = key
        self.boot_id_file = Path(boot_id_file)
        self._state: KvmState | None = None
        self._lock = threading.Lock()

    def state(self) -> KvmState:
        with self._lock:
            if self._state is None:
                self._state = self._load_or_probe()
            return self._state

    def forget(self) -> None:
        """Probe again on the next call (the operator fixed KVM without a reboot)."""
        with self._lock:
            self._state = None
            self.cache_file.unlink(missing_ok=True)

    def _load_or_probe(self) -> KvmState:
        boot = self.boot_id_file.read_text().strip() if self.boot_id_file.exists() else ""
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.cache_file.with_name(self.cache_file.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cached = self._read(boot)
            if cached is not None:
                return cached
            verdict = self.inner.state()
            log.info("KVM probe: usable=%s (%s)", verdict.usable, verdict.reason)
            tmp = self.cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"boot_id": boot, "key": self.key, "probe": PROBE_VERSION, **asdict(verdict)}))
            tmp.replace(self.cache_file)
            return verdict

    def _read(self, boot: str) -> KvmState | None:
        try:
            data = json.loads(self.cache_file.read_text())
        except (OSError, ValueError):
            return None
        if not boot or data.get("boot_id") != boot or data.get("key") != self.key or data.get("probe") != PROBE_VERSION:
            return None
        try:
            return KvmState(bool(data["usable"]), str(data["reason"]), str(data.get("domain_type", "kvm")),
                            float(data.get("checked_at", 0)))
        except (KeyError, TypeError, ValueError):
            return None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _last_line(text: bytes, starting: bytes = b"") -> str:
    lines = [line for line in text.decode(errors="replace").splitlines() if line.strip()]
    if starting:
        lines = [line for line in lines if starting.decode() in line] or lines
    return _one_line(lines[-1]) if lines else ""


def _qemu_log_tail(name: str) -> str:
    lines = [line for line in _read(QEMU_LOG_DIR / f"{name}.log").decode(errors="replace").splitlines()
             if line.strip() and not line.startswith(("LC_ALL=", "PATH=", "HOME=", "USER=", "/usr/bin/qemu"))]
    return _one_line(" ".join(lines[-3:])) or "QEMU logged nothing"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:600]
