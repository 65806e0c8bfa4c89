"""Fail-closed sites: a node whose site sets ``fail_closed_unix`` serves its VIPs only while its
link to the control plane is up (docs/sites.md "Fail-closed sites").

fabricd answers every registration and heartbeat with the node's site's ``fail_closed_unix``
(None: the site fails open, the node keeps serving its last services while fabricd is away).
When the last successful heartbeat is older than the window (FABRIC_FAIL_CLOSED_WINDOW_SECS,
30 s by default) and the site's time has passed (a disconnected site may serve its last
snapshot until ``fail_closed_unix``; 0 means not at all), the agent deletes every Maglev
service from its dataplane, which also withdraws their BGP announcements, and refuses new ones
(503 ``fail_closed``) until a heartbeat succeeds again. It says so in /v1/health, in
``fabric_agent_fail_closed`` and in its heartbeat report (``services_withdrawn``), from which
fabricd's routing controller pushes every service to the node again; the first push clears it.

``decide`` is the pure part; ``FailClosed`` applies it to the dataplane.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.state import as_dict
from common.errors import TransientError

log = logging.getLogger("fabric-agent.fail-closed")

DEFAULT_WINDOW_S = 30.0


def decide(fail_closed_unix: float | None, last_ok: float | None, now: float, window_s: float) -> str:
    """Why the node must stop serving now, or '' when it may serve.

    last_ok None (no heartbeat answered since start) serves: the node has not learnt its site's
    setting yet, and withdrawing on an unknown setting would close every fail-open site too."""
    if fail_closed_unix is None or last_ok is None:
        return ""
    silent = now - last_ok
    if silent <= window_s or now < fail_closed_unix:
        return ""
    return (f"fail-closed: no heartbeat answered by fabricd for {silent:.0f}s (window {window_s:.0f}s) and "
            f"the site serves disconnected only until {fail_closed_unix:.0f}; Maglev services withdrawn")


@dataclass
class FailClosed:
    """The node's link state and what it withdrew. Every method is thread-safe (the heartbeat
    thread calls link_up/link_down, the API's threads call admit_put and status)."""

    dataplane: Any  # agent.state.DataplaneLike, or None: nothing to withdraw
    bgp: Any = None  # agent.bgp.announcer.BgpAnnouncer, poked after the services go
    window_s: float = DEFAULT_WINDOW_S
    on_change: Callable[[bool], None] | None = None  # the metric's setter
    fail_closed_unix: float | None = None
    last_ok: float | None = None
    withdrawn: str = ""  # why the services were withdrawn; '' while serving
    _link_down: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def link_up(self, fail_closed_unix: float | None, now: float) -> None:
        """A heartbeat was answered: remember the site's setting. What was withdrawn stays
        withdrawn until fabricd pushes it again (admit_put), which the report tells it to do."""
        with self._lock:
            self.fail_closed_unix, self.last_ok, self._link_down = fail_closed_unix, now, False

    def link_down(self, now: float) -> None:
        """A heartbeat failed: withdraw once the window and the site's time have passed."""
        with self._lock:
            self._link_down = True
            why = decide(self.fail_closed_unix, self.last_ok, now, self.window_s)
            if not why or self.withdrawn:
                return
            self.withdrawn = why
            removed = self._withdraw()
        log.warning("%s (%d services)", why, removed)
        if self.on_change is not None:
            self.on_change(True)

    def _withdraw(self) -> int:
        if self.dataplane is None:
            return 0
        removed = 0
        for svc in [as_dict(s) for s in self.dataplane.list_services()]:
            if self.dataplane.delete_service(str(svc["vip"]), int(svc["port"]), str(svc["proto"])):
                removed += 1
        if self.bgp is not None:
            self.bgp.poke()  # withdraw the VIPs' routes now, not at the next pass
        return removed

    def admit_put(self) -> None:
        """Before a service is written: refused while withdrawn and the link is still down; the
        first write after the link is back ends the withdrawal (fabricd is pushing again)."""
        with self._lock:
            if not self.withdrawn:
                return
            if self._link_down:
                raise TransientError(f"{self.withdrawn}; services return when fabricd answers again",
                                     code="fail_closed")
            self.withdrawn = ""
        log.info("fail-closed: fabricd is back and pushing services again")
        if self.on_change is not None:
            self.on_change(False)
