"""The fabric bridge and the per-replica tap NICs, through pyroute2 (netlink).

The agent creates each VM's tap itself (persistent, attached to the bridge, up) and the
domain XML uses it with managed='no', so the tap's life follows the replica's, not
libvirt's, and deleting a replica removes exactly its tap. Everything here is idempotent.

`netns` (optional) runs the same operations inside a named network namespace; tests use
it so they never touch the host's own links. Production leaves it None.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from dataclasses import dataclass

from pyroute2 import IPRoute, NetlinkError, NetNS

from common.errors import InvalidInput, NotFound

IFNAMSIZ = 15


@dataclass
class BridgeNetwork:
    bridge: str = "fabric0"
    netns: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.bridge)

    @contextlib.contextmanager
    def _ip(self) -> Iterator[IPRoute]:
        ip = NetNS(self.netns) if self.netns else IPRoute()
        try:
            yield ip
        finally:
            ip.close()

    def ensure_bridge(self) -> int:
        """Create the bridge if absent and set it up; returns its ifindex."""
        with self._ip() as ip:
            index = _index(ip, self.bridge)
            if index is None:
                try:
                    ip.link("add", ifname=self.bridge, kind="bridge")
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST:  # another agent thread made it meanwhile
                        raise
                index = _index(ip, self.bridge)
            ip.link("set", index=index, state="up")
            return index

    def create_tap(self, name: str) -> int:
        """A persistent tap on the bridge, up; an existing one is re-attached, not recreated."""
        _check_name(name)
        bridge_index = self.ensure_bridge()
        with self._ip() as ip:
            index = _index(ip, name)
            if index is None:
                try:
                    ip.link("add", ifname=name, kind="tuntap", mode="tap")
                except NetlinkError as exc:
                    if exc.code != errno.EEXIST:
                        raise
                index = _index(ip, name)
            ip.link("set", index=index, master=bridge_index)
            ip.link("set", index=index, state="up")
            return index

    def delete_tap(self, name: str) -> bool:
        """True when a tap was removed, False when there was none."""
        _check_name(name)
        with self._ip() as ip:
            index = _index(ip, name)
            if index is None:
                return False
            try:
                ip.link("del", index=index)
            except NetlinkError as exc:
                if exc.code == errno.ENODEV:
                    return False
                raise
            return True

    def master_of(self, name: str) -> str | None:
        """The bridge a link is attached to (None when none)."""
        with self._ip() as ip:
            index = _index(ip, name)
            if index is None:
                raise NotFound(f"no link {name}")
            (link,) = ip.link("get", index=index)
            master = link.get_attr("IFLA_MASTER")
            if not master:
                return None
            (parent,) = ip.link("get", index=master)
            return parent.get_attr("IFLA_IFNAME")


def _index(ip: IPRoute, name: str) -> int | None:
    found = ip.link_lookup(ifname=name)
    return found[0] if found else None


def _check_name(name: str) -> None:
    if not name or len(name) > IFNAMSIZ or "/" in name or any(c.isspace() for c in name):
        raise InvalidInput(f"interface name {name!r} must be 1-{IFNAMSIZ} characters without spaces or '/'")
