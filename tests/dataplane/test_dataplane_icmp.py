"""ICMP for VIP flows through BPF_PROG_TEST_RUN: echo to a VIP answered, and ICMP
errors quoting a VIP flow translated both ways, compared byte for byte with what
scapy builds (every checksum recomputed: outer IP, ICMP, quoted IP, quoted TCP)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scapy.all import ICMP, IP, TCP, Ether, Raw

from agent.dataplane.testrun import XDP_PASS, run_xdp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_dataplane_packets import L2, TC_ACT_OK, _backend_of, _run, _valid

CLIENT = "10.0.0.2"
ROUTER = "10.0.0.1"  # the node's address toward the client, or a router on the way
VIP = "10.9.8.1"
BACKEND = "10.1.0.11:8080"
NODE_IP = "10.2.0.1"
SNAT_VIP = "10.9.8.2"
ROUTED = "10.3.0.5:8080"


@pytest.fixture(scope="module")
def dp(plain_plane):
    plain_plane.put_service(VIP, 80, "tcp", {BACKEND: 1})
    yield plain_plane
    plain_plane.delete_service(VIP, 80, "tcp")


@pytest.fixture(scope="module")
def sdp(snat_plane):
    snat_plane.put_service(SNAT_VIP, 80, "tcp", {ROUTED: 1})
    yield snat_plane
    snat_plane.delete_service(SNAT_VIP, 80, "tcp")


def _quote(src: str, sport: int, dst: str, dport: int) -> bytes:
    """The quoted packet: a whole IP + TCP header (checksums as sent)."""
    return bytes(IP(src=src, dst=dst, id=7) / TCP(sport=sport, dport=dport, flags="A", seq=1000, ack=2000))


def _error(outer_src: str, outer_dst: str, quote: bytes, l2=L2):
    return l2 / IP(src=outer_src, dst=outer_dst, id=9) / ICMP(type=3, code=4, nexthopmtu=1200) / Raw(quote)


def test_echo_request_to_a_vip_is_answered(dp):
    ping = L2 / IP(src=CLIENT, dst=VIP, ttl=61) / ICMP(type=8, id=0x1234, seq=7) / Raw(b"abcdefgh")
    result, changed = _run(dp, bytes(ping))
    # the reply goes up to the kernel, which routes it back to the client
    assert (result.retval, changed) == (XDP_PASS, {"reply_icmp_echo": 1})
    want = L2 / IP(src=VIP, dst=CLIENT, ttl=61) / ICMP(type=0, id=0x1234, seq=7) / Raw(b"abcdefgh")
    assert result.output == bytes(want) and _valid(result.output)


def test_echo_to_a_non_vip_and_other_icmp_to_a_vip_pass_untouched(dp):
    for pkt, verdict in ((L2 / IP(src=CLIENT, dst="10.5.5.5") / ICMP(type=8), "pass_not_vip"),
                         (L2 / IP(src=CLIENT, dst=VIP) / ICMP(type=13), "pass_not_tcp_udp"),
                         # an error about a flow the VIP does not have
                         (_error(ROUTER, VIP, _quote(VIP, 80, CLIENT, 1)), "pass_not_tcp_udp")):
        result, changed = _run(dp, bytes(pkt))
        assert (result.retval, changed, result.output) == (XDP_PASS, {verdict: 1}, bytes(pkt))


def test_error_about_a_vip_flow_goes_to_its_backend_translated(dp):
    syn = L2 / IP(src=CLIENT, dst=VIP) / TCP(sport=40500, dport=80, flags="S")
    assert _backend_of(_run(dp, bytes(syn))[0].output) == BACKEND
    # a router toward the client says the VIP's packet was too big
    err = _error(ROUTER, VIP, _quote(VIP, 80, CLIENT, 40500))
    result, changed = _run(dp, bytes(err))
    assert (result.retval, changed) == (XDP_PASS, {"fwd_icmp_error": 1})
    want = _error(ROUTER, "10.1.0.11", _quote("10.1.0.11", 8080, CLIENT, 40500))
    assert result.output == bytes(want) and _valid(result.output)


def test_error_from_the_node_to_a_client_about_a_backend_packet_gets_the_vip_view(dp):
    syn = L2 / IP(src=CLIENT, dst=VIP) / TCP(sport=40501, dport=80, flags="S")
    _run(dp, bytes(syn))
    # forwarding the client's DNATed packet to the backend needed fragmentation (path MTU)
    err = _error(ROUTER, CLIENT, _quote(CLIENT, 40501, "10.1.0.11", 8080), l2=Ether())
    result = run_xdp(dp._prog.tc.fd, bytes(err))
    assert result.retval == TC_ACT_OK
    want = _error(ROUTER, CLIENT, _quote(CLIENT, 40501, VIP, 80), l2=Ether())
    assert result.output == bytes(want) and _valid(result.output)
    # the backend itself reporting: its address never reaches the client
    err = _error("10.1.0.11", CLIENT, _quote(CLIENT, 40501, "10.1.0.11", 8080), l2=Ether())
    want = _error(VIP, CLIENT, _quote(CLIENT, 40501, VIP, 80), l2=Ether())
    assert run_xdp(dp._prog.tc.fd, bytes(err)).output == bytes(want)
    # an error about a packet to a backend that is no VIP flow is left alone
    other = _error(ROUTER, CLIENT, _quote(CLIENT, 40999, "10.1.0.11", 8080), l2=Ether())
    assert run_xdp(dp._prog.tc.fd, bytes(other)).output == bytes(other)


def test_source_nat_flow_errors_translate_both_ways(sdp):
    syn = L2 / IP(src=CLIENT, dst=SNAT_VIP) / TCP(sport=40600, dport=80, flags="S")
    out = Ether(_run(sdp, bytes(syn))[0].output)
    snat_port = out[TCP].sport
    # the routed backend reports about a packet the node sent it (from node_ip:snat_port)
    err = _error("10.3.0.5", NODE_IP, _quote(NODE_IP, snat_port, "10.3.0.5", 8080))
    result, changed = _run(sdp, bytes(err))
    assert (result.retval, changed) == (XDP_PASS, {"reply_icmp_error": 1})
    want = _error(SNAT_VIP, CLIENT, _quote(CLIENT, 40600, SNAT_VIP, 80))
    assert result.output == bytes(want) and _valid(result.output)
    # a router toward the client reports about the VIP's packet: the backend sees its own packet
    err = _error(ROUTER, SNAT_VIP, _quote(SNAT_VIP, 80, CLIENT, 40600))
    result, changed = _run(sdp, bytes(err))
    assert (result.retval, changed) == (XDP_PASS, {"fwd_icmp_error": 1})
    want = _error(ROUTER, "10.3.0.5", _quote("10.3.0.5", 8080, NODE_IP, snat_port))
    assert result.output == bytes(want) and _valid(result.output)
