"""Which VIPs this node announces: a pure function of what it serves and whether it can.

A VIP is announced as a /32 only while
* the XDP program is attached to every ingress interface the agent was given (a node whose
  program is gone would blackhole the flows ECMP sends it), and
* at least one service on that VIP has a ready backend: weight above 0 and not draining (the
  routing controller pushes only ready, scraped replicas, so a pushed backend with weight is
  one that can take a new flow).
Everything else is withdrawn: a deleted service, a service whose backends all drain or weigh 0,
a detached program. Each VIP carries the reason it is in or out, for events and explain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceReadiness:
    """One service as the dataplane holds it: how many of its backends can take new flows."""

    vip: str
    port: int
    proto: str
    ready_backends: int
    backends: int


@dataclass(frozen=True)
class AnnouncePlan:
    announce: frozenset[str]  # VIP addresses to announce as /32
    reasons: Mapping[str, str]  # every VIP seen (and withdrawn ones) -> why it is in or out

    def prefixes(self) -> list[str]:
        return [f"{vip}/32" for vip in sorted(self.announce, key=_ip_key)]


def _ip_key(vip: str) -> tuple[int, ...]:
    return tuple(int(p) for p in vip.split("."))


def plan_announcements(services: Iterable[ServiceReadiness], attached: Mapping[str, bool]) -> AnnouncePlan:
    """attached: ingress interface -> whether the XDP program is attached there now."""
    services = list(services)
    missing = sorted(iface for iface, on in attached.items() if not on)
    by_vip: dict[str, list[ServiceReadiness]] = {}
    for svc in services:
        by_vip.setdefault(svc.vip, []).append(svc)
    announce: set[str] = set()
    reasons: dict[str, str] = {}
    for vip, svcs in sorted(by_vip.items(), key=lambda kv: _ip_key(kv[0])):
        ready = [s for s in svcs if s.ready_backends > 0]
        if not attached:
            reasons[vip] = "withdrawn: no ingress interface has the XDP program"
        elif missing:
            reasons[vip] = f"withdrawn: the XDP program is not attached on {', '.join(missing)}"
        elif not ready:
            names = ", ".join(f"{s.port}/{s.proto}" for s in sorted(svcs, key=lambda s: (s.port, s.proto)))
            reasons[vip] = f"withdrawn: no ready backend on {names} (all drain, weigh 0 or are gone)"
        else:
            announce.add(vip)
            n = sum(s.ready_backends for s in ready)
            reasons[vip] = f"announced: {n} ready backend{'s' if n != 1 else ''} on {len(ready)} service(s)"
    return AnnouncePlan(announce=frozenset(announce), reasons=reasons)
