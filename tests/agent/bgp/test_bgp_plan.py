"""The announcement planner, the settings and BIRD's configuration, with plain data."""

from __future__ import annotations

import subprocess

import pytest

from agent.bgp.bird import ProtocolState, parse_protocols, render_config
from agent.bgp.plan import ServiceReadiness, plan_announcements
from agent.settings import BgpSettings, Peer
from common.errors import InvalidInput

ON = {"FABRIC_BGP": "1", "FABRIC_BGP_LOCAL_ASN": "65001", "FABRIC_BGP_PEERS": "10.250.0.1:65000"}


def svc(vip: str, ready: int, total: int = 2, port: int = 80) -> ServiceReadiness:
    return ServiceReadiness(vip, port, "tcp", ready, total)


def test_announces_only_vips_with_a_ready_backend_while_attached():
    plan = plan_announcements([svc("10.96.0.5", 2), svc("10.96.0.6", 0), svc("10.96.0.6", 1, port=443),
                               svc("10.96.0.7", 0)], {"eth0": True})
    assert plan.announce == {"10.96.0.5", "10.96.0.6"}
    assert plan.prefixes() == ["10.96.0.5/32", "10.96.0.6/32"]
    assert plan.reasons["10.96.0.7"].startswith("withdrawn: no ready backend on 80/tcp")
    assert plan.reasons["10.96.0.5"] == "announced: 2 ready backends on 1 service(s)"


def test_nothing_is_announced_while_any_ingress_lacks_the_program():
    services = [svc("10.96.0.5", 2)]
    assert plan_announcements(services, {"up": True, "cli": False}).announce == frozenset()
    assert "not attached on cli" in plan_announcements(services, {"up": True, "cli": False}).reasons["10.96.0.5"]
    assert plan_announcements(services, {}).announce == frozenset()


def test_no_services_nothing_announced():
    plan = plan_announcements([], {"eth0": True})
    assert plan.announce == frozenset() and plan.prefixes() == []


def test_prefixes_sort_numerically():
    plan = plan_announcements([svc("10.96.0.10", 1), svc("10.96.0.9", 1)], {"e": True})
    assert plan.prefixes() == ["10.96.0.9/32", "10.96.0.10/32"]


def test_settings_off_by_default_and_parsed_when_on():
    assert BgpSettings.from_env({}).enabled is False
    assert BgpSettings.from_env({"FABRIC_BGP": "0", "FABRIC_BGP_LOCAL_ASN": "x"}).enabled is False
    s = BgpSettings.from_env(ON | {"FABRIC_BGP_COMMUNITIES": "65000:100, 65000:200", "FABRIC_BGP_HOLD_SECS": "3",
                                   "FABRIC_BGP_BFD": "1", "FABRIC_BGP_PEERS": "10.250.0.1:65000,10.250.1.1:65002"},
                             node_ip="10.250.0.2")
    assert s.local_asn == 65001 and s.router_id == "10.250.0.2" and s.hold_secs == 3 and s.keepalive_secs == 1
    assert s.peers == (Peer("10.250.0.1", 65000), Peer("10.250.1.1", 65002)) and s.bfd
    assert s.communities == ((65000, 100), (65000, 200))


@pytest.mark.parametrize("env, name", [
    ({"FABRIC_BGP": "yes"}, "FABRIC_BGP"),
    ({"FABRIC_BGP_LOCAL_ASN": ""}, "FABRIC_BGP_LOCAL_ASN"),
    ({"FABRIC_BGP_LOCAL_ASN": "4294967295"}, "FABRIC_BGP_LOCAL_ASN"),
    ({"FABRIC_BGP_LOCAL_ASN": "65k"}, "FABRIC_BGP_LOCAL_ASN"),
    ({"FABRIC_BGP_PEERS": ""}, "FABRIC_BGP_PEERS"),
    ({"FABRIC_BGP_PEERS": "10.250.0.1"}, "FABRIC_BGP_PEERS"),
    ({"FABRIC_BGP_PEERS": "10.250.0.300:65000"}, "FABRIC_BGP_PEERS"),
    ({"FABRIC_BGP_PEERS": "10.250.0.1:0"}, "FABRIC_BGP_PEERS"),
    ({"FABRIC_BGP_PEERS": "10.250.0.1:1,10.250.0.1:2"}, "FABRIC_BGP_PEERS"),
    ({"FABRIC_BGP_ROUTER_ID": "127.0.0.1"}, "FABRIC_BGP_ROUTER_ID"),
    ({"FABRIC_BGP_COMMUNITIES": "65000"}, "FABRIC_BGP_COMMUNITIES"),
    ({"FABRIC_BGP_COMMUNITIES": "65000:70000"}, "FABRIC_BGP_COMMUNITIES"),
    ({"FABRIC_BGP_HOLD_SECS": "2"}, "FABRIC_BGP_HOLD_SECS"),
    ({"FABRIC_BGP_BFD": "on"}, "FABRIC_BGP_BFD"),
    ({"FABRIC_BGP_BFD_INTERVAL_MS": "5"}, "FABRIC_BGP_BFD_INTERVAL_MS"),
    ({"FABRIC_BGP_BIRD": "bird -d"}, "FABRIC_BGP_BIRD"),
])
def test_a_bad_value_names_its_variable(env, name):
    with pytest.raises(InvalidInput) as err:
        BgpSettings.from_env(ON | env)
    assert name in str(err.value)


def test_rendered_configuration_parses_in_bird(tmp_path):
    s = BgpSettings.from_env(ON | {"FABRIC_BGP_COMMUNITIES": "65000:100", "FABRIC_BGP_BFD": "1",
                                   "FABRIC_BGP_PEERS": "10.250.0.1:65000,10.250.1.1:65000"}, node_ip="10.250.0.2")
    for prefixes in ([], ["10.96.0.5/32", "10.96.0.6/32"]):
        text = render_config(s, prefixes, str(tmp_path / "bird.log"))
        assert all(f"route {p} blackhole;" in text for p in prefixes)
        assert text.count("protocol bgp ") == 2 and "bfd on;" in text and "bgp_community.add((65000,100));" in text
        conf = tmp_path / "bird.conf"
        conf.write_text(text)
        res = subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True, timeout=10)
        assert res.returncode == 0, res.stderr


def test_parse_protocols():
    text = """BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     1764619200
vips       Static     master4    up     1764619200
peer_10_250_0_1 BGP        ---        up     1764619201    Established
peer_10_250_1_1 BGP        ---        start  1764619201    Active        Socket: Connection refused
"""
    got = parse_protocols(text)
    assert got["peer_10_250_0_1"] == ProtocolState("peer_10_250_0_1", "BGP", "up", "Established")
    assert got["peer_10_250_0_1"].established
    assert not got["peer_10_250_1_1"].established
    assert got["peer_10_250_1_1"].info == "Active Socket: Connection refused"
    assert got["device1"].info == ""
