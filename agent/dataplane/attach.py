"""Attach and detach the XDP and TC programs on a device, in any network namespace.

XDP goes on the device's ingress (forward path and source-NAT replies); the TC
program goes on its clsact egress (replies from bridge backends). Both outlive
the agent process by design, so detach is explicit. An existing clsact qdisc
(EEXIST) is taken as already there.
"""

from __future__ import annotations

import errno

from agent.dataplane.netns import run_in_netns
from common.errors import NotFound

TC_EGRESS_PARENT = 0xFFFFFFF3  # clsact egress
TC_INGRESS_PARENT = 0xFFFFFFF2  # clsact ingress
TC_FILTER_NAME = "fabric_reverse_nat"
TC_REPLY_FILTER_NAME = "fabric_reply_redirect"
TC_PRIO = 1
TC_HANDLE = 1


def _index(ipr, iface: str) -> int:
    found = ipr.link_lookup(ifname=iface)
    if not found:
        raise NotFound(f"interface {iface} not found")
    return found[0]


def _ensure_clsact(ipr, idx: int) -> None:
    """Add the clsact qdisc; one already there (EEXIST) is taken as it is."""
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipr.tc("add", "clsact", idx)
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise


def _write_sysctl(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def attach_programs(iface: str, netns: str | None, xdp_fn, tc_fd: int, source_nat: bool) -> None:
    """xdp_fn: the BCC function handle of xdp_maglev (BCC insists on its own type)."""

    def body() -> None:
        from bcc import BPF
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            idx = _index(ipr, iface)
            # A newer program replaces the old one in one step: no gap in forwarding.
            BPF.attach_xdp(iface, xdp_fn, 0)
            _ensure_clsact(ipr, idx)
            # "replace" swaps the program of the existing filter (same prio and
            # handle) in one netlink request, or adds it: no window without reverse NAT.
            ipr.tc("replace-filter", "bpf", idx, TC_HANDLE, fd=tc_fd, name=TC_FILTER_NAME,
                   parent=TC_EGRESS_PARENT, prio=TC_PRIO, classid=1, direct_action=True)
        if source_nat:
            # Source-NATed packets arrive carrying node_ip, a local address: the
            # kernel drops them as martians unless accept_local is on and the
            # reverse-path filter is off for this device.
            _write_sysctl(f"/proc/sys/net/ipv4/conf/{iface}/accept_local", "1")
            _write_sysctl(f"/proc/sys/net/ipv4/conf/{iface}/rp_filter", "0")

    run_in_netns(netns, body)


def _bridges(ipr) -> list[int]:
    out = []
    for msg in ipr.get_links():
        info = msg.get_attr("IFLA_LINKINFO")
        if info and info.get_attr("IFLA_INFO_KIND") == "bridge":
            out.append(msg["index"])
    return out


def attach_bridge_ingress(netns: str | None, tc_reply_fd: int) -> None:
    """tc_reply_redirect on the clsact ingress of every bridge of the namespace:
    replies of local backends enter the node's stack there (replaced in place)."""

    def body() -> None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            for idx in _bridges(ipr):
                _ensure_clsact(ipr, idx)
                ipr.tc("replace-filter", "bpf", idx, TC_HANDLE, fd=tc_reply_fd, name=TC_REPLY_FILTER_NAME,
                       parent=TC_INGRESS_PARENT, prio=TC_PRIO, classid=1, direct_action=True)

    run_in_netns(netns, body)


def detach_bridge_ingress(netns: str | None) -> None:
    def body() -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            for idx in _bridges(ipr):
                try:
                    ipr.tc("del-filter", "bpf", idx, TC_HANDLE, parent=TC_INGRESS_PARENT, prio=TC_PRIO)
                except NetlinkError as exc:
                    if exc.code not in (errno.ENOENT, errno.EINVAL):
                        raise

    run_in_netns(netns, body)


def detach_programs(iface: str, netns: str | None) -> None:
    def body() -> None:
        from bcc import BPF
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            idx = _index(ipr, iface)
            BPF.remove_xdp(iface, 0)
            try:
                ipr.tc("del-filter", "bpf", idx, TC_HANDLE, parent=TC_EGRESS_PARENT, prio=TC_PRIO)
            except NetlinkError as exc:
                if exc.code not in (errno.ENOENT, errno.EINVAL):
                    raise

    run_in_netns(netns, body)


def xdp_attached(iface: str, netns: str | None) -> bool:
    """Whether an XDP program is attached to `iface` now (False when the device is gone)."""

    def body() -> bool:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=iface)
            if not found:
                return False
            xdp = ipr.get_links(found[0])[0].get_attr("IFLA_XDP")
            if xdp is None:
                return False
            return bool(xdp.get_attr("IFLA_XDP_PROG_ID") or xdp.get_attr("IFLA_XDP_ATTACHED"))

    return run_in_netns(netns, body)


def node_addresses(netns: str | None) -> list[str]:
    """Every IPv4 address of the namespace (None: the caller's own)."""

    def body() -> list[str]:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            return [msg.get_attr("IFA_ADDRESS") for msg in ipr.get_addr(family=2)]

    return run_in_netns(netns, body)


def route_is_via_bridge(ip: str, netns: str | None) -> bool:
    """True when the route to `ip` leaves through a bridge device (a local backend)."""

    def body() -> bool:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            try:
                routes = ipr.route("get", dst=ip)
            except NetlinkError:
                return False
            if not routes:
                return False
            oif = routes[0].get_attr("RTA_OIF")
            links = ipr.link("get", index=oif)
            info = links[0].get_attr("IFLA_LINKINFO") if links else None
            kind = info.get_attr("IFLA_INFO_KIND") if info else None
            return kind == "bridge"

    return run_in_netns(netns, body)

