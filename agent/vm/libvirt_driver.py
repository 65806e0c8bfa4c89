"""The production VM driver: QEMU/KVM guests through libvirt, GPUs by VFIO.

create(spec) = qcow2 overlay on the golden image + cloud-init seed + tap on the fabric
bridge + define + start; delete undoes all of it. Domains are named fabric-{replica_id}
and carry the replica id in <metadata>, so list() sees only ours. GPUs must already be
bound to vfio-pci (agent.hw.vfio); the XML uses managed='no' so libvirt never rebinds.

The engine's address is known only once the guest has one: we ask libvirt for the
interface addresses (DHCP lease, then ARP, then the guest agent) matching the replica's
MAC, then read the host's ARP table ourselves (libvirt 9.0's ARP source fails on recent
kernels, agent.net.arp_table), and report host=None with a message until then.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import libvirt

from agent.hw.kvm import KvmProbe
from agent.hw.pci_sysfs import nvidia_functions
from agent.hw.vfio import GpuBinder
from agent.net.arp_table import read_arp_address
from agent.net.bridge import BridgeNetwork
from agent.vm.base import VmSpec, VmState, VmStatus
from agent.vm.cloud_init import build_seed, has_adapters, write_seed_iso
from agent.vm.domain_xml import (
    DirectBoot,
    Firmware,
    build_domain_xml,
    domain_name,
    guest_hostname,
    mac_for,
    tap_name,
)
from agent.vm.host_tuning import (
    HUGEPAGE_CHOICES,
    HostTuning,
    plan_tuning,
    read_hugepage_pools,
    read_node_cpus,
    read_virtiofsd_version,
    readonly_share_supported,
)
from agent.vm.overlay import create_overlay
from agent.vm.ro_bind import ensure_ro_bind, remove_ro_bind
from common.errors import InvalidInput, NotFound, Refused, TransientError

log = logging.getLogger(__name__)

PREFIX = "fabric-"
REPLICA_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")

_STATES: dict[int, VmState] = {
    libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "running",
    libvirt.VIR_DOMAIN_PAUSED: "starting",
    libvirt.VIR_DOMAIN_SHUTDOWN: "stopped",
    libvirt.VIR_DOMAIN_SHUTOFF: "stopped",
    libvirt.VIR_DOMAIN_CRASHED: "failed",
    libvirt.VIR_DOMAIN_PMSUSPENDED: "stopped",
    libvirt.VIR_DOMAIN_NOSTATE: "starting",
}


@dataclass(frozen=True)
class ReplicaPaths:
    overlay: Path
    seed: Path
    nvram: Path


class LibvirtDriver:
    name = "libvirt"

    def __init__(
        self,
        uri: str = "qemu:///system",
        *,
        image: Path,
        state_dir: Path,
        bridge: str = "fabric0",
        models_dir: Path,
        hugepages: str = "auto",
        numa: str = "auto",
        readonly_share: str = "auto",
        sysfs_root: Path = Path("/sys"),
        binder: GpuBinder | None = None,
        firmware: Firmware | None = None,
        network: BridgeNetwork | None = None,
        domain_type: str = "kvm",
        boot: DirectBoot | None = None,
        kvm: KvmProbe | None = None,
        images_dir: Path | None = None,
        secrets: tuple[tuple[str, str], ...] = (),
    ):
        """hugepages auto|1G|2M|off and numa auto|off: agent.vm.host_tuning. readonly_share:
        auto (virtiofs <readonly/> where libvirt and virtiofsd support it, else a read-only bind
        mount), virtiofs or bind. binder: binds an HGX board's NVSwitches for full passthrough.
        domain_type kvm, or qemu (TCG) and boot (a kernel + initramfs instead of OVMF): the
        GPU-less boot proof (scripts/vm-boot-check) on hosts whose KVM cannot run a stock guest.
        domain_type auto: kvm where `kvm` (agent.hw.kvm) says KVM works, else TCG for a GPU-less
        guest. A GPU guest never runs under TCG: it is refused when the domain type is qemu or
        the probe says KVM does not work here."""
        if domain_type not in ("kvm", "qemu", "auto"):
            raise InvalidInput(f"domain_type {domain_type!r}: expected kvm, qemu (TCG) or auto")
        if domain_type == "auto" and kvm is None:
            raise InvalidInput("domain_type auto needs a KVM probe")
        self.uri = uri
        self.image = Path(image)
        self.state_dir = Path(state_dir)
        self.bridge = bridge
        self.models_dir = Path(models_dir)
        if readonly_share not in ("auto", "virtiofs", "bind"):
            raise InvalidInput(f"readonly_share {readonly_share!r}: expected auto, virtiofs or bind")
        if hugepages not in HUGEPAGE_CHOICES or numa not in ("auto", "off"):
            raise InvalidInput(f"hugepages {hugepages!r} / numa {numa!r}: expected one of "
                               f"{', '.join(HUGEPAGE_CHOICES)} / auto or off")
        self.hugepages = hugepages
        self.numa = numa
        self.readonly_share = readonly_share
        self.sysfs_root = Path(sysfs_root)
        self.binder = binder
        self._readonly: tuple[bool, str] | None = None
        self.firmware = firmware or Firmware()
        self.network = network or BridgeNetwork(bridge)
        self.domain_type = domain_type
        self.boot = boot
        self.kvm = kvm
        self.images_dir = images_dir  # AgentSettings.images_dir: the guest pieces (None: the package's)
        self.secrets = secrets  # AgentSettings.secrets: a seed holding one is refused
        self._conn: libvirt.virConnect | None = None
        self._lock = threading.Lock()

    # -- VmDriver -------------------------------------------------------------

    def create(self, spec: VmSpec) -> VmStatus:
        _check_id(spec.replica_id)
        existing = self.get(spec.replica_id)
        if existing is not None:
            return existing
        paths = self.paths(spec.replica_id)
        try:
            self.define(spec)
            self.start(spec.replica_id)
        except Exception:
            self.delete(spec.replica_id)  # leave nothing half-made behind
            raise
        return self.get(spec.replica_id) or VmStatus(
            spec.replica_id, "failed", message=f"{paths.overlay} vanished"
        )

    def log_path(self, vm_id: str) -> Path:
        """The guest's serial console as libvirt logs it (the domain XML's <serial><log file>)."""
        _check_id(vm_id)
        return self.state_dir / "console" / f"{domain_name(vm_id)}.log"

    def get(self, vm_id: str) -> VmStatus | None:
        dom = self._lookup(vm_id)
        if dom is None:
            return None
        return self._status(vm_id, dom)

    def list(self) -> list[VmStatus]:
        out = []
        for dom in self._connection().listAllDomains():
            name = dom.name()
            if name.startswith(PREFIX):
                out.append(self._status(name[len(PREFIX) :], dom))
        return sorted(out, key=lambda s: s.id)

    def delete(self, vm_id: str) -> bool:
        _check_id(vm_id)
        existed = self.destroy(vm_id)
        existed = self.undefine(vm_id) or existed
        paths = self.paths(vm_id)
        removed = [_unlink(paths.overlay), _unlink(paths.seed), _unlink(paths.nvram)]
        removed.append(remove_ro_bind(self.share_dir(vm_id)))
        removed.append(remove_ro_bind(self.adapters_share_dir(vm_id)))
        self._release_nvswitches()
        removed.append(self.network.delete_tap(tap_name(vm_id)))
        return existed or any(removed)

    # -- lifecycle steps ------------------------------------------------------

    def paths(self, vm_id: str) -> ReplicaPaths:
        name = domain_name(vm_id)
        return ReplicaPaths(
            self.state_dir / f"{name}.qcow2",
            self.state_dir / f"{name}-seed.iso",
            self.state_dir / f"{name}_VARS.fd",
        )

    def share_dir(self, vm_id: str) -> Path:
        """Where the read-only bind mount of the model directory goes (bind mode)."""
        return self.state_dir / "ro-models" / domain_name(vm_id)

    def readonly_mode(self) -> tuple[bool, str]:
        """(virtiofs <readonly/> usable, why), decided once from the versions found."""
        if self._readonly is None:
            if self.readonly_share == "auto":
                self._readonly = readonly_share_supported(self._connection().getLibVersion(),
                                                          read_virtiofsd_version())
            else:
                self._readonly = (self.readonly_share == "virtiofs", f"readonly_share={self.readonly_share}")
        return self._readonly

    def tuning(self, spec: VmSpec) -> HostTuning:
        return plan_tuning(spec.gpus, nvidia_functions(self.sysfs_root), hugepages=self.hugepages, numa=self.numa,
                           pools=read_hugepage_pools(self.sysfs_root), node_cpus=read_node_cpus(self.sysfs_root),
                           readonly=self.readonly_mode())

    def domain_xml(self, spec: VmSpec, tuning: HostTuning | None = None) -> str:
        paths = self.paths(spec.replica_id)
        tuning = tuning or self.tuning(spec)
        models = Path(spec.model_dir) if spec.model_dir else self.models_dir
        return build_domain_xml(
            spec,
            overlay=paths.overlay,
            seed_iso=paths.seed,
            mac=mac_for(spec.replica_id),
            bridge=self.bridge,
            models_dir=models if tuning.virtiofs_readonly else self.share_dir(spec.replica_id),
            console_log=self.log_path(spec.replica_id),
            firmware=Firmware(self.firmware.loader, self.firmware.vars_template, paths.nvram),
            tuning=tuning,
            tap=tap_name(spec.replica_id),
            domain_type=self.accelerator(spec),
            boot=self.boot,
            adapters_dir=self.adapters_source(spec, tuning),
        )

    def accelerator(self, spec: VmSpec) -> str:
        """The domain type this replica gets (kvm or qemu), or Refused with the reason."""
        if self.domain_type == "qemu":
            if spec.gpus:
                raise Refused(f"replica {spec.replica_id} has GPUs: a GPU guest never runs under TCG "
                              f"(this driver is set to domain type qemu)")
            return "qemu"
        verdict = self.kvm.state() if self.kvm is not None else None
        if verdict is None or verdict.usable:
            return "kvm"
        if spec.gpus:
            raise Refused(f"KVM does not work on this host, and a GPU guest never runs under TCG: "
                          f"{verdict.reason} (docs/gpu-hosts.md: KVM)")
        if self.domain_type == "auto":
            log.warning("replica %s runs under TCG: KVM does not work here (%s)", spec.replica_id, verdict.reason)
            return "qemu"
        raise Refused(f"KVM does not work on this host: {verdict.reason} (start the agent with "
                      f"--domain-type auto to run GPU-less guests under TCG; docs/gpu-hosts.md: KVM)")

    def adapters_source(self, spec: VmSpec, tuning: HostTuning) -> Path | None:
        """The adapters share's host directory: the set itself, or its read-only bind mount."""
        if not has_adapters(spec):
            return None
        return Path(spec.adapters_dir) if tuning.virtiofs_readonly else self.adapters_share_dir(spec.replica_id)

    def adapters_share_dir(self, vm_id: str) -> Path:
        """Where the read-only bind mount of the adapter set goes (bind mode)."""
        return self.state_dir / "ro-adapters" / domain_name(vm_id)

    def define(self, spec: VmSpec) -> None:
        """Overlay, seed, tap, then the domain definition (not started)."""
        _check_id(spec.replica_id)
        self.accelerator(spec)  # a KVM refusal comes first, before any sysfs read or bind
        paths = self.paths(spec.replica_id)
        tuning = self.tuning(spec)
        xml = self.domain_xml(spec, tuning)  # validates the spec before anything is written
        log.info("domain %s: %s", domain_name(spec.replica_id), tuning.note)
        if not tuning.virtiofs_readonly:
            ensure_ro_bind(Path(spec.model_dir) if spec.model_dir else self.models_dir,
                           self.share_dir(spec.replica_id))
            if has_adapters(spec):
                ensure_ro_bind(Path(spec.adapters_dir), self.adapters_share_dir(spec.replica_id))
        for switch in tuning.nvswitches:
            if self.binder is None:
                raise Refused("full passthrough on an HGX board needs the VFIO binder for the NVSwitches")
            self.binder.bind(switch)
        create_overlay(self.image, paths.overlay)
        meta, user = build_seed(spec, hostname=guest_hostname(spec.replica_id),
                                instance_id=domain_name(spec.replica_id),
                                models_dir=None if spec.model_dir else self.models_dir,
                                images=self.images_dir, secrets=self.secrets)
        write_seed_iso(self.state_dir, meta, user, name=paths.seed.name, secrets=self.secrets)
        self.network.create_tap(tap_name(spec.replica_id))
        self.log_path(spec.replica_id).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._connection().defineXML(xml)
        except libvirt.libvirtError as exc:
            raise Refused(
                f"libvirt rejected the domain for {spec.replica_id}: {exc.get_error_message()}"
            ) from None

    def start(self, vm_id: str) -> None:
        dom = self._require(vm_id)
        if dom.isActive():
            return
        try:
            dom.create()
        except libvirt.libvirtError as exc:
            raise Refused(
                f"libvirt could not start {domain_name(vm_id)}: {exc.get_error_message()}"
            ) from None

    def state(self, vm_id: str) -> VmState:
        dom = self._lookup(vm_id)
        if dom is None:
            return "absent"
        state, _reason = dom.state()
        return _STATES.get(state, "failed")

    def destroy(self, vm_id: str) -> bool:
        dom = self._lookup(vm_id)
        if dom is None or not dom.isActive():
            return False
        try:
            dom.destroy()
        except libvirt.libvirtError as exc:
            if dom.isActive():
                raise TransientError(
                    f"could not stop {domain_name(vm_id)}: {exc.get_error_message()}"
                ) from None
        return True

    def undefine(self, vm_id: str) -> bool:
        dom = self._lookup(vm_id)
        if dom is None:
            return False
        try:
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        except libvirt.libvirtError:
            dom.undefine()  # drivers without NVRAM support; we remove the file ourselves
        return True

    # -- internals ------------------------------------------------------------

    def _release_nvswitches(self) -> None:
        """Full passthrough gives every NVSwitch to the one VM holding the whole board: once no
        domain of ours is left, switches we bound go back to the host."""
        if self.binder is None or self.list():
            return
        for fn in nvidia_functions(self.sysfs_root):
            if fn.is_nvswitch and fn.driver == "vfio-pci":
                self.binder.release(fn.bdf)

    def _connection(self) -> libvirt.virConnect:
        with self._lock:
            if self._conn is None or not self._conn.isAlive():
                # libvirt prints every error (an expected "domain not found" too) to stderr by
                # default; we turn them into our own errors, so silence the printer.
                libvirt.registerErrorHandler(_ignore_libvirt_error, None)
                try:
                    self._conn = libvirt.open(self.uri)
                except libvirt.libvirtError as exc:
                    raise TransientError(
                        f"cannot reach libvirt at {self.uri}: {exc.get_error_message()}"
                    ) from None
            return self._conn

    def _lookup(self, vm_id: str) -> libvirt.virDomain | None:
        _check_id(vm_id)
        try:
            return self._connection().lookupByName(domain_name(vm_id))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise TransientError(
                f"libvirt lookup of {domain_name(vm_id)} failed: {exc.get_error_message()}"
            ) from None

    def _require(self, vm_id: str) -> libvirt.virDomain:
        dom = self._lookup(vm_id)
        if dom is None:
            raise NotFound(f"no VM for replica {vm_id}")
        return dom

    def _status(self, vm_id: str, dom: libvirt.virDomain) -> VmStatus:
        state, _reason = dom.state()
        vm_state = _STATES.get(state, "failed")
        port = _metadata_port(dom)
        if vm_state != "running":
            return VmStatus(vm_id, vm_state, None, port, f"domain {dom.name()} is {vm_state}")
        host = guest_address(dom, mac_for(vm_id)) or read_arp_address(mac_for(vm_id), self.bridge)
        if host is None:
            return VmStatus(
                vm_id,
                "running",
                None,
                port,
                "running; guest address not known yet (no DHCP lease, ARP entry or guest agent answer)",
            )
        return VmStatus(vm_id, "running", host, port, f"running at {host}")


def guest_address(dom: libvirt.virDomain, mac: str) -> str | None:
    """The guest's IPv4 on the NIC with this MAC, from the first source that knows it."""
    sources = (
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
        libvirt.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
    )
    for source in sources:
        try:
            interfaces = dom.interfaceAddresses(source) or {}
        except libvirt.libvirtError:
            continue  # e.g. no guest agent yet; try the next source
        for iface in interfaces.values():
            if (iface.get("hwaddr") or "").lower() != mac.lower():
                continue
            for addr in iface.get("addrs") or []:
                if addr.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and addr.get("addr"):
                    return addr["addr"]
    return None


def _metadata_port(dom: libvirt.virDomain) -> int:
    match = re.search(r"<(?:\w+:)?port>(\d+)</(?:\w+:)?port>", dom.XMLDesc(0))
    return int(match.group(1)) if match else 8000


def _ignore_libvirt_error(_ctx: object, _err: object) -> None:
    return None


def _check_id(vm_id: str) -> None:
    if not REPLICA_ID.match(vm_id or ""):
        raise InvalidInput(f"replica id {vm_id!r}: use 1-63 lowercase letters, digits, '.', '_' or '-'")


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
