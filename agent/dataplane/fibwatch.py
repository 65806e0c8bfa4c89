"""Keep the per-CPU forwarding cache honest: watch the namespace's routing state.

xdp_maglev caches each backend's fib result (egress device, MAC pair) in
`fib_cache`, valid while `fib_gen` keeps the generation it was filled under
(dataplane/bpf/maglev.c, xmit_xdp). This thread, started by Dataplane.attach,
listens to the attached namespace's rtnetlink groups for links, addresses,
IPv4 routes and rules and neighbours (the bridge FDB arrives as AF_BRIDGE
neighbour messages) and, after each burst of messages, calls `on_change`
(re-read the device maps, bump the generation). With no message for
`period_s` it bumps anyway, so a change the groups do not carry (or a message
lost to a full socket buffer) is picked up within that bound.

`classify` is pure: which messages mean "the device and FDB snapshot may be
stale too" (links and FDB) and which only invalidate the cache.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable, Iterable

from agent.dataplane.netns import NETNS_DIR, _setns

log = logging.getLogger(__name__)

FIB_CACHE_SECS = 1.0  # the longest a cached decision outlives a change the groups did not report
RTM_NEWLINK, RTM_DELLINK = 16, 17
RTM_NEWNEIGH, RTM_DELNEIGH = 28, 29


def groups() -> int:
    from pyroute2.netlink.rtnl import (
        RTMGRP_IPV4_IFADDR,
        RTMGRP_IPV4_ROUTE,
        RTMGRP_IPV4_RULE,
        RTMGRP_LINK,
        RTMGRP_NEIGH,
    )

    return RTMGRP_LINK | RTMGRP_NEIGH | RTMGRP_IPV4_ROUTE | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_RULE


def classify(messages: Iterable[tuple[int, int]]) -> tuple[bool, bool]:
    """(anything at all, links or bridge FDB among them) for (nlmsg type, family) pairs."""
    seen = devices = False
    for kind, family in messages:
        seen = True
        if kind in (RTM_NEWLINK, RTM_DELLINK) or (kind in (RTM_NEWNEIGH, RTM_DELNEIGH) and family == socket.AF_BRIDGE):
            devices = True
    return seen, devices


class FibWatch:
    """One daemon thread per Dataplane: on_change(devices_changed) after each burst."""

    def __init__(self, netns: str | None, on_change: Callable[[bool], None], period_s: float = FIB_CACHE_SECS):
        self._netns = netns
        self._on_change = on_change
        self._period = period_s
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"fibwatch-{netns or 'host'}", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from pyroute2 import IPRoute

        try:
            if self._netns is not None:
                _setns(f"{NETNS_DIR}/{self._netns}")
            ipr = IPRoute()
            ipr.bind(groups=groups())
        except BaseException as exc:  # noqa: BLE001  reported by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([ipr.fileno()], [], [], self._period)
                batch: list[tuple[int, int]] = []
                lost = False
                while readable:
                    try:
                        batch += [(m["header"]["type"], m.get("family", 0)) for m in ipr.get()]
                    except OSError:  # ENOBUFS: messages were lost; assume the worst
                        lost = True
                    readable, _, _ = select.select([ipr.fileno()], [], [], 0)
                if self._stop.is_set():
                    break
                devices = classify(batch)[1] or lost
                try:
                    self._on_change(devices)  # a quiet period bumps too: the time bound
                except Exception:
                    log.exception("fib cache refresh failed")
        finally:
            ipr.close()
