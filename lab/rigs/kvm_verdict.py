"""Which domain type tests that start real guests use: KVM where it really runs a guest, else TCG.

The verdict is agent.hw.kvm's probe (a transient guest booting the host's kernel
through its init to COM1), run
once per boot for every test process and kept in /run (tmpfs: gone at the next boot). A test
prints the verdict's reason when it falls back to TCG, so a run on a host whose nested KVM
cannot take the host CPU model (QEMU: `failed to set MSR 0x10a`) or whose KVM is PVM says why.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agent.hw.kvm import CachedKvmProbe, KvmProbe, KvmState, LibvirtKvmProbe

URI = "qemu:///system"
CACHE = Path("/run/fabric-tests/kvm-probe.json")
# QEMU runs as libvirt-qemu: the probe's disk must be somewhere it can read.
WORK = Path("/var/lib/libvirt/images/fabric-kvm-probe")


def host_probe() -> KvmProbe:
    return CachedKvmProbe(LibvirtKvmProbe(URI, work_dir=WORK), CACHE, key=URI)


def choose_domain_type(probe: KvmProbe, out=None) -> tuple[str, KvmState]:
    """("kvm" | "qemu", the verdict); says on `out` (stderr) why when it is TCG."""
    verdict = probe.state()
    if verdict.usable:
        return "kvm", verdict
    print(f"\n[kvm] using TCG (domain type qemu): KVM does not run a guest here: {verdict.reason}",
          file=out or sys.stderr, flush=True)
    return "qemu", verdict
