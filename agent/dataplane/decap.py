"""dsr-ipip on a backend without a kernel IPIP driver (the lab's replica namespaces).

A dsr-ipip service (docs/dataplane.md) sends the client's packet to the backend
inside an outer IPv4 header. A guest decapsulates with its ipip module's tunl0
(the cloud-init seed sets it up); this kernel has no IPIP driver, so a lab
replica runs dataplane/bpf/ipip_decap.c on its own eth0 instead, holds the VIP
on loopback and answers the client from it directly. Everything happens inside
the replica's namespace: never on the host's interfaces.
"""

from __future__ import annotations

import ipaddress
import subprocess

from agent.dataplane.loader import BPF_DIR
from agent.dataplane.netns import run_in_netns

# A VIP held on loopback must not be announced or answered for on eth0 (ARP),
# and replies leave from it towards clients the backend reached only through the tunnel.
GUEST_SYSCTLS = {
    "net.ipv4.conf.all.arp_ignore": "1",
    "net.ipv4.conf.all.arp_announce": "2",
    "net.ipv4.conf.all.rp_filter": "0",
    "net.ipv4.conf.default.rp_filter": "0",
}


def _ns(netns: str) -> list[str]:
    return ["ip", "netns", "exec", netns]


def enable_dsr_backend(netns: str, dev: str, address: str, vips: list[str]) -> None:
    """Make the backend in `netns` (eth `dev`, own `address`) accept dsr-ipip traffic for `vips`."""
    from bcc import BPF  # Debian python3-bpfcc

    ip = ipaddress.IPv4Address(address)
    decap_addr = int.from_bytes(ip.packed, "little")  # network-order bytes read as a host u32
    bpf = BPF(src_file=str(BPF_DIR / "ipip_decap.c"), cflags=[f"-DDECAP_ADDR={decap_addr}u"])
    fn = bpf.load_func("xdp_ipip_decap", BPF.XDP)
    run_in_netns(netns, lambda: BPF.attach_xdp(dev, fn, 0))  # the attachment outlives this handle
    for key, value in GUEST_SYSCTLS.items():
        subprocess.run([*_ns(netns), "sysctl", "-qw", f"{key}={value}"], check=True, capture_output=True, timeout=30)
    for vip in vips:
        ipaddress.IPv4Address(vip)
        subprocess.run(["ip", "-n", netns, "addr", "replace", f"{vip}/32", "dev", "lo"], check=True,
                       capture_output=True, timeout=30)
