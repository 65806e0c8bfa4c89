"""Boot the tiny guest (lab/rigs/tiny_guest.py) through our LibvirtDriver on qemu:///system.

Shared by scripts/vm-boot-check (the full boot, JSON with timings) and
tests/agent/test_vm_boot.py. The network is a transient libvirt network, isolated (no
<forward>: libvirt's own isolated mode), with DHCP from libvirt's dnsmasq on a /24 this run
picks from 10.250.0.0/16 where the host has no route; the driver puts the replica's tap on that
network's bridge exactly as it does on fabric0. Everything is removed by `close()`: the
replica through `LibvirtDriver.delete`, then the network (bridge, dnsmasq, its address).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import libvirt

from agent.net.bridge import BridgeNetwork
from agent.vm.base import VmSpec
from agent.vm.domain_xml import DirectBoot, domain_name, tap_name
from agent.vm.libvirt_driver import LibvirtDriver
from lab.rigs.tiny_guest import TinyGuest

REPO = Path(__file__).resolve().parents[2]
URI = "qemu:///system"
# Console lines after which the guest cannot come up (tiny_guest's /init and init print them).
FATAL = ("tiny-initramfs: cannot", "FAILED:", "Kernel panic")


def start_libvirtd() -> None:
    up = subprocess.run([str(REPO / "scripts/libvirtd-up.sh")], capture_output=True, text=True, timeout=180)
    if up.returncode != 0:
        raise RuntimeError(f"libvirtd-up.sh: {up.stderr.strip()}")


def free_subnet() -> ipaddress.IPv4Network:
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    taken = []
    for word in routes.split():
        try:
            taken.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for third in range(20 + os.getpid() % 200, 256):
        net = ipaddress.ip_network(f"10.250.{third}.0/24")
        if not any(net.overlaps(t) for t in taken if t.prefixlen > 0):
            return net
    raise RuntimeError("no free /24 in 10.250.0.0/16")


@dataclass
class BootRun:
    """One replica on one isolated network; `close()` removes both."""

    work: Path
    guest: TinyGuest
    virt: str  # "kvm" or "qemu" (TCG)
    replica_id: str = field(default_factory=lambda: f"boot-{os.getpid()}")
    memory_gib: float = 1.0

    def __post_init__(self) -> None:
        suffix = f"{os.getpid() % 100000}"
        self.bridge = f"fabvb{suffix}"
        self.net_name = f"fabric-boot-{suffix}"
        self.subnet = free_subnet()
        self.conn = libvirt.open(URI)
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])
        self.network = self.conn.networkCreateXML(
            f"<network><name>{self.net_name}</name><bridge name='{self.bridge}' stp='off'/>"
            f"<ip address='{self.gateway}' netmask='255.255.255.0'>"
            f"<dhcp><range start='{hosts[9]}' end='{hosts[29]}'/></dhcp></ip></network>")
        models = self.work / "models/org/tiny"
        models.mkdir(parents=True, exist_ok=True)
        (models / "config.json").write_text('{"num_attention_heads": 8, "num_hidden_layers": 2}')
        self.driver = LibvirtDriver(
            URI, image=self.guest.golden, state_dir=self.work / "vms", models_dir=self.work / "models",
            bridge=self.bridge, network=BridgeNetwork(self.bridge), hugepages="off", numa="off",
            domain_type=self.virt, boot=DirectBoot(self.guest.kernel, self.guest.initrd, self.guest.cmdline))
        self.spec = VmSpec(replica_id=self.replica_id, deployment="boot-check", model_name="tiny-chat",
                           model_source="hf://org/tiny", cpu=1, memory_gib=self.memory_gib)

    def create(self) -> str:
        return self.driver.create(self.spec).state

    def console(self) -> str:
        try:
            return self.driver.log_path(self.replica_id).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def qemu_log_tail(self) -> str:
        path = Path("/var/log/libvirt/qemu") / f"{domain_name(self.replica_id)}.log"
        try:
            return path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def wait_health(self, timeout_s: float) -> tuple[str | None, int | None, str]:
        """(address, /health status, why) once the driver reports an address and /health answers."""
        deadline = time.monotonic() + timeout_s
        host, why = None, "no address yet"
        while time.monotonic() < deadline:
            if self.driver.state(self.replica_id) in ("stopped", "failed", "starting") and \
                    "emulation failure" in self.qemu_log_tail():
                return None, None, "KVM emulation failure (QEMU paused the guest)"
            fatal = [line for line in self.console().splitlines() if any(m in line for m in FATAL)]
            if fatal:
                return None, None, f"guest failed: {fatal[0].strip()}"
            status = self.driver.get(self.replica_id)
            host = status.host if status else None
            if host:
                try:
                    with urllib.request.urlopen(f"http://{host}:{status.port}/health", timeout=3) as resp:
                        return host, resp.status, "answered"
                except OSError as exc:
                    why = f"/health on {host}: {exc}"
            time.sleep(1)
        if not self.console().strip():
            why = "the guest printed nothing on its console"  # e.g. a stock kernel under PVM KVM
        return host, None, f"timeout after {timeout_s:.0f}s ({why})"

    def get_json(self, path: str) -> dict:
        import json

        status = self.driver.get(self.replica_id)
        with urllib.request.urlopen(f"http://{status.host}:{status.port}{path}", timeout=10) as resp:
            return json.load(resp)

    def leftovers(self) -> dict[str, object]:
        """What is left of the replica and the network (all empty/False after close)."""
        names = [d.name() for d in self.conn.listAllDomains()]
        nets = [n.name() for n in self.conn.listAllNetworks()]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        procs = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        vms = self.work / "vms"
        return {
            "domain": domain_name(self.replica_id) in names,
            "network": self.net_name in nets,
            "tap": f" {tap_name(self.replica_id)}:" in links or f" {tap_name(self.replica_id)}@" in links,
            "bridge": f" {self.bridge}:" in links,
            "files": sorted(p.name for p in vms.iterdir() if p.name != "console") if vms.exists() else [],
            "virtiofsd": self.replica_id in "".join(line for line in procs.splitlines() if "virtiofsd" in line),
            "dnsmasq": any("dnsmasq" in line and self.net_name in line for line in procs.splitlines()),
            "qemu": any("qemu-system" in line and domain_name(self.replica_id) in line
                        for line in procs.splitlines()),
            "libvirt_logs": sorted(p.name for p in Path("/var/log/libvirt/qemu").glob(
                f"{domain_name(self.replica_id)}[.-]*log")),
        }

    def close(self) -> None:
        try:
            self.driver.delete(self.replica_id)
        finally:
            try:
                self.network.destroy()  # transient: destroying it undefines it, removes bridge and dnsmasq
            except libvirt.libvirtError:
                pass
            # libvirt's own per-domain logs (QEMU's and virtiofsd's): a host keeps them for its
            # operators, a test run leaves none behind.
            for log in Path("/var/log/libvirt/qemu").glob(f"{domain_name(self.replica_id)}[.-]*log"):
                log.unlink(missing_ok=True)


def seed_findings(console: str, run: BootRun) -> dict[str, bool]:
    """What the guest's console says it did with our seed; every value True on a good boot."""
    name = domain_name(run.replica_id)
    lease = re.search(r"network: eth0 ([\d.]+)/24 by DHCP", console)
    return {
        "kernel_started": "tiny-initramfs: loading modules" in console,
        "root_mounted": "tiny-initramfs: switch_root" in console,
        "seed_read": f"seed read: instance {name}, hostname {name}" in console,
        "dhcp_on_tap_network": bool(lease) and ipaddress.ip_address(lease.group(1)) in run.subnet,
        "models_unit_ok": "fabric-models.service: oneshot exited 0 (active)" in console,
        "virtiofs_read_only": "/models: virtiofs ro write refused (Read-only file system); entries ['org']" in console,
        "engine_unit_as_vllm": ("fabric-engine.service: exec as vllm: /opt/vllm/bin/vllm serve /models/org/tiny "
                                "--served-model-name tiny-chat --host 0.0.0.0 --port 8000") in console,
        "seed_applied": "seed applied" in console,
    }


def wait_console(run: BootRun, marker: str, timeout_s: float) -> str:
    """The console once `marker` appears (or the guest failed, or time ran out)."""
    deadline = time.monotonic() + timeout_s
    console = run.console()
    while time.monotonic() < deadline and marker not in console:
        if any(m in console for m in FATAL):
            break
        time.sleep(1)
        console = run.console()
    return console


def work_dir(tag: str) -> Path:
    # Under /var/lib/libvirt/images: QEMU runs as libvirt-qemu and cannot enter a 0700 tmp dir.
    base = Path(f"/var/lib/libvirt/images/fabric-{tag}-{os.getpid()}")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    return base
