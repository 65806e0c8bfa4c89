"""The loop that keeps BIRD announcing exactly what plan.py decides, and watches the peers.

Every `interval_s` (and at once when `poke`d: the agent's API pokes after every service put or
delete) it reads the dataplane's services and attachment, plans, and reloads BIRD when the set
changed. It also reads BIRD's sessions: a peer that refuses, flaps or drops is an event (kept
in a bounded list, logged) and a metric, never an exception out of the loop; BIRD itself retries
the session. A BIRD that died is started again, with a growing pause between tries.

`stop` withdraws everything (an empty reload) and then stops BIRD with SIGTERM, which closes
each session with a Cease notification: a clean agent stop leaves no route behind. An agent
that dies takes BIRD with it (bird.py: PDEATHSIG), so its peers withdraw when the TCP session
closes; a node that goes silent loses its routes at the hold timer (or BFD).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from agent.bgp.bird import BirdDaemon, BirdError, ProtocolState
from agent.bgp.plan import AnnouncePlan, ServiceReadiness, plan_announcements
from agent.settings import BgpSettings

log = logging.getLogger("fabric-agent.bgp")
MAX_EVENTS = 200


class ReadinessSource(Protocol):
    def readiness(self) -> list[tuple[str, int, str, int, int]]: ...

    def xdp_attached(self, iface: str, netns: str | None = None) -> bool: ...


class Daemon(Protocol):
    def start(self, prefixes: Sequence[str] = ()) -> None: ...

    def configure(self, prefixes: Sequence[str]) -> None: ...

    def protocols(self) -> dict[str, ProtocolState]: ...

    def alive(self) -> bool: ...

    def stop(self, timeout: float = 5.0) -> None: ...


@dataclass(frozen=True)
class BgpEvent:
    at: float  # unix time
    kind: str  # announce, withdraw, peer, daemon, error
    message: str


class BgpAnnouncer:
    def __init__(self, settings: BgpSettings, dataplane: ReadinessSource, ifaces: Sequence[str],
                 netns: str | None, run_dir: Path, registry: CollectorRegistry | None = None,
                 interval_s: float = 1.0, daemon: Daemon | None = None,
                 clock: Callable[[], float] = time.time):
        self.settings = settings
        self.dataplane = dataplane
        self.ifaces = tuple(ifaces)
        self.netns = netns
        self.interval_s = interval_s
        self.daemon: Daemon = daemon or BirdDaemon(settings, run_dir, netns)
        self._clock = clock
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._applied: frozenset[str] | None = None  # what BIRD announces now (None: unknown)
        self._plan = AnnouncePlan(frozenset(), {})
        self._peers: dict[str, ProtocolState] = {}
        self._events: deque[BgpEvent] = deque(maxlen=MAX_EVENTS)
        self._restart_pause = 1.0
        self._next_start = 0.0
        registry = registry if registry is not None else CollectorRegistry()
        self._m_announced = Gauge("fabric_agent_bgp_announced_vips", "VIPs this node announces now",
                                  registry=registry)
        self._m_peer_up = Gauge("fabric_agent_bgp_peer_up", "1 while the BGP session is Established",
                                ["peer"], registry=registry)
        self._m_transitions = Counter("fabric_agent_bgp_peer_transitions", "BGP session state changes",
                                      ["peer", "state"], registry=registry)
        self._m_reloads = Counter("fabric_agent_bgp_reloads", "BIRD reloads with a new announcement set",
                                  ["result"], registry=registry)
        self._m_restarts = Counter("fabric_agent_bgp_daemon_starts", "BIRD starts (the first and restarts)",
                                   ["result"], registry=registry)
        for peer in settings.peers:
            self._m_peer_up.labels(peer.address).set(0)

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bgp-announcer", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Re-plan now (a service changed)."""
        self._wake.set()

    def stop(self) -> None:
        """Withdraw every VIP, then stop BIRD (Cease to every peer)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(15)

    def _run(self) -> None:
        # BIRD is started from this thread: PDEATHSIG follows the forking thread, and this one
        # lives exactly as long as the announcer.
        try:
            while not self._stop.is_set():
                self.step()
                self._wake.wait(self.interval_s)
                self._wake.clear()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        try:
            if self.daemon.alive():
                self.daemon.configure([])
                self._record("withdraw", "agent stopping: every VIP withdrawn")
        except BirdError as exc:
            log.warning("bgp: withdraw at stop failed: %s", exc)
        self.daemon.stop()
        self._applied = None
        self._m_announced.set(0)

    # -- one pass --------------------------------------------------------------

    def plan(self) -> AnnouncePlan:
        try:
            services = [ServiceReadiness(*row) for row in self.dataplane.readiness()]
            attached = {iface: self.dataplane.xdp_attached(iface, self.netns) for iface in self.ifaces}
        except Exception as exc:  # noqa: BLE001 - maps or netlink unreadable: announce nothing
            self._record("error", f"cannot read the dataplane ({type(exc).__name__}: {exc}): withdrawing")
            return AnnouncePlan(frozenset(), {})
        return plan_announcements(services, attached)

    def step(self) -> None:
        """Plan, apply, read the peers; never raises."""
        plan = self.plan()
        with self._lock:
            self._plan = plan
        if not self.daemon.alive() and not self._start_daemon(plan):
            return
        if plan.announce != self._applied:
            try:
                self.daemon.configure(plan.prefixes())
            except BirdError as exc:
                self._m_reloads.labels("error").inc()
                self._record("error", f"reload failed: {exc}")
                return
            self._m_reloads.labels("ok").inc()
            before = self._applied or frozenset()
            for vip in sorted(plan.announce - before):
                self._record("announce", f"{vip}/32 {plan.reasons.get(vip, 'announced')}")
            for vip in sorted(before - plan.announce):
                self._record("withdraw", f"{vip}/32 {plan.reasons.get(vip, 'withdrawn: no service on it')}")
            self._applied = plan.announce
            self._m_announced.set(len(plan.announce))
        self._read_peers()

    def _start_daemon(self, plan: AnnouncePlan) -> bool:
        now = time.monotonic()
        if now < self._next_start:
            return False
        if self._applied is not None:
            self._record("daemon", "bird is not running: starting it again")
        try:
            self.daemon.start(plan.prefixes())
        except BirdError as exc:
            self._m_restarts.labels("error").inc()
            self._record("error", f"bird did not start: {exc}; next try in {self._restart_pause:.0f} s")
            self._next_start = now + self._restart_pause
            self._restart_pause = min(self._restart_pause * 2, 30.0)
            self._applied = None
            self._m_announced.set(0)  # no daemon: nothing is announced
            return False
        self._m_restarts.labels("ok").inc()
        self._restart_pause = 1.0
        self._applied = plan.announce
        self._m_announced.set(len(plan.announce))
        for vip in sorted(plan.announce):
            self._record("announce", f"{vip}/32 {plan.reasons.get(vip, 'announced')}")
        self._peers = {}
        return True

    def _read_peers(self) -> None:
        try:
            states = self.daemon.protocols()
        except BirdError as exc:
            self._record("error", f"cannot read BIRD's sessions: {exc}")
            return
        for peer in self.settings.peers:
            now = states.get(peer.name)
            was = self._peers.get(peer.name)
            if now is None:
                continue
            up = now.established
            self._m_peer_up.labels(peer.address).set(1 if up else 0)
            if was is None or was.established != up or (not up and was.info != now.info):
                label = "established" if up else "down"
                self._m_transitions.labels(peer.address, label).inc()
                self._record("peer", f"peer {peer.address} (AS {peer.asn}): "
                             f"{'Established' if up else now.state + ' ' + now.info}".rstrip())
            self._peers[peer.name] = now

    def _record(self, kind: str, message: str) -> None:
        level = logging.WARNING if kind == "error" or (kind == "peer" and "Established" not in message) \
            else logging.INFO
        log.log(level, "bgp: %s", message)
        with self._lock:
            self._events.append(BgpEvent(self._clock(), kind, message))

    # -- views -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        with self._lock:
            plan, events = self._plan, list(self._events)
        return {
            "local_asn": self.settings.local_asn,
            "router_id": self.settings.router_id,
            "hold_secs": self.settings.hold_secs,
            "bfd": self.settings.bfd,
            "announced": sorted(self._applied or (), key=lambda v: tuple(int(p) for p in v.split("."))),
            "reasons": dict(plan.reasons),
            "peers": [{"address": p.address, "asn": p.asn,
                       "state": (self._peers[p.name].state if p.name in self._peers else "unknown"),
                       "info": (self._peers[p.name].info if p.name in self._peers else ""),
                       "established": bool(p.name in self._peers and self._peers[p.name].established)}
                      for p in self.settings.peers],
            "events": [{"at": e.at, "kind": e.kind, "message": e.message} for e in events[-50:]],
        }
