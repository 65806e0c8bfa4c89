"""The guest's address from the host kernel's ARP table, read by us rather than through libvirt.

libvirt's own ARP source fails on Debian 12's libvirt 9.0 with recent kernels ("internal error:
wrong nlmsg len" from its netlink neighbour dump), so LibvirtDriver falls back to
/proc/net/arp: the entry with the replica's MAC on the replica's bridge, complete (flags
ATF_COM) and not a stale address of another interface.
"""

from __future__ import annotations

from pathlib import Path

ATF_COM = 0x2  # the entry is complete (a MAC is known)


def arp_address(arp_text: str, mac: str, device: str | None = None) -> str | None:
    """The IPv4 address /proc/net/arp lists for `mac` (on `device` when given), else None."""
    for line in arp_text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 6:
            continue
        ip, _hw_type, flags, hwaddr, _mask, dev = fields[:6]
        try:
            complete = int(flags, 16) & ATF_COM
        except ValueError:
            continue
        if complete and hwaddr.lower() == mac.lower() and (device is None or dev == device):
            return ip
    return None


def read_arp_address(mac: str, device: str | None = None, path: Path = Path("/proc/net/arp")) -> str | None:
    try:
        return arp_address(path.read_text(), mac, device)
    except OSError:
        return None
