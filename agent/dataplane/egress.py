"""Which devices XDP may send to, and behind which bridge port each MAC sits.

After translation xdp_maglev asks the kernel's fib (bpf_fib_lookup) for the
egress device and redirects the frame there (dataplane/bpf/xmit.h). XDP can
transmit only on devices that implement XDP transmit: veth (when its peer runs
NAPI: an XDP program or GRO on the peer), tap and physical NICs. A bridge does
not, so a route through a bridge is sent to the bridge port that the bridge's
forwarding database names for the next hop's MAC. `plan_egress` turns a
snapshot of the namespace's links and FDB into the two maps' contents (pure);
`read_namespace` takes the snapshot; Dataplane.refresh_egress writes it.

A device missing from the maps is never an error: the packet goes through the
kernel stack as before (XMIT_UNKNOWN_DEV), so a stale or empty snapshot costs
speed, never a packet. A stale port (a MAC that moved) sends frames to a port
whose host ignores them until the next refresh (every service update).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from agent.dataplane.netns import run_in_netns

EGRESS_DIRECT = 1  # maps.h
EGRESS_BRIDGE = 2
NUD_PERMANENT = 0x80  # the bridge's own addresses ("local" FDB entries): never a next hop
# Link kinds that take XDP frames (no kind: a physical NIC).
DIRECT_KINDS = {"veth", "tun", None}


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str | None


@dataclass(frozen=True)
class FdbEntry:
    port: int  # ifindex of the bridge port
    bridge: int  # ifindex of the bridge (NDA_MASTER)
    mac: str
    state: int


@dataclass(frozen=True)
class EgressPlan:
    devices: dict[int, int]  # ifindex -> EGRESS_*
    ports: dict[tuple[int, str], int]  # (bridge ifindex, MAC) -> port ifindex


def plan_egress(links: list[Link], fdb: list[FdbEntry]) -> EgressPlan:
    devices = {}
    for link in links:
        if link.name == "lo":
            continue
        if link.kind == "bridge":
            devices[link.index] = EGRESS_BRIDGE
        elif link.kind in DIRECT_KINDS:
            devices[link.index] = EGRESS_DIRECT
    ports = {}
    for e in fdb:
        # a port that can take XDP frames itself; the bridge's own (permanent) entries are no next hop
        if e.state & NUD_PERMANENT or devices.get(e.bridge) != EGRESS_BRIDGE:
            continue
        if devices.get(e.port) == EGRESS_DIRECT:
            ports[(e.bridge, e.mac.lower())] = e.port
    return EgressPlan(devices=devices, ports=ports)


def read_namespace(netns: str | None) -> tuple[list[Link], list[FdbEntry]]:
    """The links and bridge FDB of a namespace (None: the caller's own)."""

    def body():
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            links = []
            for msg in ipr.get_links():
                info = msg.get_attr("IFLA_LINKINFO")
                kind = info.get_attr("IFLA_INFO_KIND") if info else None
                links.append(Link(index=msg["index"], name=msg.get_attr("IFLA_IFNAME"), kind=kind))
            fdb = []
            for msg in ipr.neigh("dump", family=socket.AF_BRIDGE):
                master, mac = msg.get_attr("NDA_MASTER"), msg.get_attr("NDA_LLADDR")
                if master and mac:
                    fdb.append(FdbEntry(port=msg["ifindex"], bridge=master, mac=mac, state=msg["state"]))
            return links, fdb

    return run_in_netns(netns, body)


def mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))
