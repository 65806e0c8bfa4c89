"""The announcer with a real BIRD on each side of a veth pair in two namespaces this test makes:
a peer that refuses is an event and a metric (the agent carries on), the same peer once it
listens gets the VIP with the node's communities, and a service change is withdrawn at once.
Also: a bad FABRIC_BGP_* value stops `fabric-agent serve` with exit 2 naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agent.bgp.announcer import BgpAnnouncer
from agent.settings import BgpSettings, Peer
from lab.rigs.polling import wait_for
from tests.agent.bgp.test_bgp_announcer import MemoryDataplane

ROUTER = """router id 10.249.0.1;
protocol device { scan time 1; }
protocol bgp node { local as 65000; neighbor 10.249.0.2 as 65001; hold time 3; keepalive time 1;
  connect retry time 1; error wait time 1, 2; ipv4 { import all; export none; }; }
"""


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30).stdout


@pytest.fixture
def pair():
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    tag = uuid.uuid4().hex[:6]
    node, router = f"fbgp-n-{tag}", f"fbgp-r-{tag}"
    for ns in (node, router):
        sh("ip", "netns", "add", ns)
    try:
        sh("ip", "-n", node, "link", "add", "up0", "type", "veth", "peer", "name", "dn0", "netns", router)
        for ns, dev, addr in ((node, "up0", "10.249.0.2/30"), (router, "dn0", "10.249.0.1/30")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield node, router
    finally:
        for ns in (node, router):
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                subprocess.run(["kill", "-9", pid])
            subprocess.run(["ip", "netns", "del", ns])


def test_refusing_peer_then_announcement_then_withdrawal(pair, tmp_path):
    node, router = pair
    settings = BgpSettings(enabled=True, local_asn=65001, peers=(Peer("10.249.0.1", 65000),), router_id="10.249.0.2",
                           communities=((65000, 7),), hold_secs=3)
    dp, reg = MemoryDataplane(), CollectorRegistry()
    dp.services[("10.97.9.1", 80, "tcp")] = (1, 1)
    a = BgpAnnouncer(settings, dp, ["up"], node, tmp_path / "bgp", registry=reg, interval_s=0.2)
    a.start()
    router_bird = None
    try:
        # nothing listens on the router yet: refused, an event and a metric, the loop goes on
        wait_for(lambda: reg.get_sample_value("fabric_agent_bgp_peer_transitions_total",
                                              {"peer": "10.249.0.1", "state": "down"}), 20, "a refused-peer event")
        assert a.status()["announced"] == ["10.97.9.1"] and not a.status()["peers"][0]["established"]
        conf = tmp_path / "router.conf"
        conf.write_text(ROUTER)
        sock = tmp_path / "router.ctl"
        router_bird = subprocess.Popen(["nsenter", f"--net=/var/run/netns/{router}", "--", "bird", "-f", "-c",
                                        str(conf), "-s", str(sock)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)

        def routes() -> str:
            return subprocess.run(["birdc", "-s", str(sock), "show", "route", "all"], capture_output=True,
                                  text=True, timeout=10).stdout

        wait_for(lambda: "10.97.9.1/32" in routes(), 30, "the router to learn the VIP")
        assert "(65000,7)" in routes()  # FABRIC_BGP_COMMUNITIES on the announcement
        wait_for(lambda: a.status()["peers"][0]["established"], 10, "the announcer to see the session up")
        assert reg.get_sample_value("fabric_agent_bgp_peer_up", {"peer": "10.249.0.1"}) == 1
        dp.services[("10.97.9.1", 80, "tcp")] = (0, 1)  # its backend drains
        a.poke()
        wait_for(lambda: "10.97.9.1/32" not in routes(), 10, "the withdrawal")
    finally:
        a.stop()
        if router_bird is not None:
            router_bird.kill()
            router_bird.wait()
    assert not a.daemon.alive()


def test_a_bad_bgp_value_stops_the_agent_with_exit_2(tmp_path):
    env = {**os.environ, "FABRIC_BGP": "1", "FABRIC_BGP_LOCAL_ASN": "65001", "FABRIC_BGP_PEERS": "10.249.0.1:x"}
    res = subprocess.run([str(Path(sys.executable).parent / "fabric-agent"), "serve", "--node-id", "n1", "--insecure",
                          "--no-dataplane", "--vm-driver", "dry-run", "--fake-gpus", "1",
                          "--state-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "FABRIC_BGP_PEERS" in res.stderr
