"""The announcer's loop over an in-memory dataplane and daemon: what it applies, the events and
metrics a refusing or flapping peer gives, a daemon that dies or will not start."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from agent.bgp.announcer import BgpAnnouncer
from agent.bgp.bird import BirdError, ProtocolState
from agent.settings import BgpSettings, Peer

SETTINGS = BgpSettings(enabled=True, local_asn=65001, peers=(Peer("10.250.0.1", 65000),))
PEER = "peer_10_250_0_1"


class MemoryDataplane:
    def __init__(self):
        self.services: dict[tuple[str, int, str], tuple[int, int]] = {}
        self.attached = {"up": True}
        self.broken = False

    def readiness(self):
        if self.broken:
            raise OSError("map gone")
        return [(v, p, pr, r, t) for (v, p, pr), (r, t) in self.services.items()]

    def xdp_attached(self, iface, netns=None):
        return self.attached.get(iface, False)


class MemoryDaemon:
    def __init__(self):
        self.running = False
        self.announced: list[str] | None = None
        self.states = {PEER: ProtocolState(PEER, "BGP", "start", "Active Socket: Connection refused")}
        self.fail_start = False
        self.starts = 0

    def start(self, prefixes: Sequence[str] = ()):
        if self.fail_start:
            raise BirdError("no bird")
        self.starts += 1
        self.running, self.announced = True, list(prefixes)

    def configure(self, prefixes):
        self.announced = list(prefixes)

    def protocols(self):
        return dict(self.states)

    def alive(self):
        return self.running

    def stop(self, timeout=5.0):
        self.running = False


def make():
    dp, daemon, reg = MemoryDataplane(), MemoryDaemon(), CollectorRegistry()
    return dp, daemon, reg, BgpAnnouncer(SETTINGS, dp, ["up"], None, "/nonexistent", registry=reg, daemon=daemon)


def metric(reg, name, **labels):
    return reg.get_sample_value(name, labels) or 0.0


def test_announce_follow_readiness_and_withdraw_on_delete():
    dp, daemon, reg, a = make()
    a.step()
    assert daemon.announced == []
    dp.services[("10.96.0.5", 80, "tcp")] = (1, 1)
    a.step()
    assert daemon.announced == ["10.96.0.5/32"] and metric(reg, "fabric_agent_bgp_announced_vips") == 1
    dp.services[("10.96.0.5", 80, "tcp")] = (0, 1)  # its only backend drains
    a.step()
    assert daemon.announced == []
    dp.services[("10.96.0.5", 80, "tcp")] = (1, 1)
    a.step()
    del dp.services[("10.96.0.5", 80, "tcp")]  # endpoint deleted
    a.step()
    assert daemon.announced == []
    kinds = [e["kind"] for e in a.status()["events"]]
    assert kinds.count("withdraw") == 2 and kinds.count("announce") == 2


def test_detached_program_or_unreadable_maps_withdraw():
    dp, daemon, _, a = make()
    dp.services[("10.96.0.5", 80, "tcp")] = (2, 2)
    a.step()
    dp.attached["up"] = False
    a.step()
    assert daemon.announced == []
    dp.attached["up"] = True
    a.step()
    assert daemon.announced == ["10.96.0.5/32"]
    dp.broken = True
    a.step()
    assert daemon.announced == [] and any(e["kind"] == "error" for e in a.status()["events"])


def test_a_refusing_then_flapping_peer_is_events_and_metrics():
    _dp, daemon, reg, a = make()
    a.step()
    assert metric(reg, "fabric_agent_bgp_peer_up", peer="10.250.0.1") == 0
    assert metric(reg, "fabric_agent_bgp_peer_transitions_total", peer="10.250.0.1", state="down") == 1
    a.step()  # unchanged: no new event
    assert metric(reg, "fabric_agent_bgp_peer_transitions_total", peer="10.250.0.1", state="down") == 1
    daemon.states[PEER] = ProtocolState(PEER, "BGP", "up", "Established")
    a.step()
    assert metric(reg, "fabric_agent_bgp_peer_up", peer="10.250.0.1") == 1
    daemon.states[PEER] = ProtocolState(PEER, "BGP", "start", "Idle Error: Hold timer expired")
    a.step()
    assert metric(reg, "fabric_agent_bgp_peer_transitions_total", peer="10.250.0.1", state="down") == 2
    peer = a.status()["peers"][0]
    assert peer["established"] is False and "Hold timer" in peer["info"]
    assert any("Hold timer expired" in e["message"] for e in a.status()["events"])


def test_a_dead_daemon_is_started_again_and_a_failing_one_backs_off():
    dp, daemon, reg, a = make()
    dp.services[("10.96.0.5", 80, "tcp")] = (1, 1)
    a.step()
    daemon.running = False
    daemon.announced = None
    a.step()
    assert daemon.starts == 2 and daemon.announced == ["10.96.0.5/32"]
    daemon.running = False
    daemon.fail_start = True
    a.step()
    a.step()  # within the pause: not tried again
    assert metric(reg, "fabric_agent_bgp_daemon_starts_total", result="error") == 1
    assert metric(reg, "fabric_agent_bgp_announced_vips") == 0  # no daemon: nothing announced


def test_stop_withdraws_then_stops_the_daemon():
    dp, daemon, _, a = make()
    dp.services[("10.96.0.5", 80, "tcp")] = (1, 1)
    a.interval_s = 0.01
    a.start()
    a.poke()
    a.stop()
    assert daemon.announced == [] and daemon.running is False
