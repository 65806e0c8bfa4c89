"""Packet tables through BPF_PROG_TEST_RUN: each case is an input packet (scapy),
an expected XDP action, an expected verdict counter and an expected output packet
whose checksums must be valid."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from scapy.all import ARP, ICMP, IP, TCP, UDP, Ether, IPOption_RR, IPv6, Raw

from agent.dataplane import Dataplane, Verdict
from agent.dataplane.testrun import XDP_DROP, XDP_PASS, run_xdp

VIP = "10.9.0.100"
ZERO_VIP = "10.9.0.101"
CLIENT = "10.0.0.2"
NODE_IP = "10.2.0.1"
WEB = {"10.1.0.11:8080": 1, "10.1.0.12:8080": 2, "10.1.0.13:8080": 4}
DNS = {"10.1.0.21:5353": 1}
L2 = Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02")
TC_ACT_OK = 0


# The session's compiled planes (tests/conftest.py, tests/dataplane/conftest.py): no compile
# of their own; the module's services are put on them and deleted at the module's end.
@pytest.fixture(scope="module")
def dp(plain_plane):
    plain_plane.put_service(VIP, 80, "tcp", WEB)
    plain_plane.put_service(VIP, 53, "udp", DNS)
    plain_plane.put_service(ZERO_VIP, 80, "tcp", {"10.1.0.31:8080": 0})
    yield plain_plane
    for vip, port, proto in ((VIP, 80, "tcp"), (VIP, 53, "udp"), (ZERO_VIP, 80, "tcp")):
        plain_plane.delete_service(vip, port, proto)


@pytest.fixture(scope="module")
def snat_dp(snat_plane):
    # No bridge route to the backend on this host, so with node_ip set it is source-NATed.
    assert snat_plane.live_node_ip() == NODE_IP
    snat_plane.put_service(VIP, 80, "tcp", {"10.3.0.5:8080": 1})
    yield snat_plane
    snat_plane.delete_service(VIP, 80, "tcp")


def _valid(raw: bytes) -> bool:
    """True when every IP/TCP/UDP checksum in raw is what scapy computes."""
    pkt = Ether(raw)
    fresh = pkt.copy()
    if IP in fresh:
        del fresh[IP].chksum
    if TCP in fresh:
        del fresh[TCP].chksum
    if UDP in fresh and pkt[UDP].chksum != 0:
        del fresh[UDP].chksum
    return bytes(fresh.__class__(bytes(fresh))) == raw


def _run(plane: Dataplane, packet: bytes, meta: int = 0):
    before = plane.verdict_counters()
    result = run_xdp(plane.xdp_fd, packet, meta=meta)
    after = plane.verdict_counters()
    changed = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    return result, changed


def _dnat(packet, backend: str):
    ip, port = backend.split(":")
    out = packet.copy()
    out[IP].dst = ip
    if TCP in out:
        out[TCP].dport = int(port)
        del out[TCP].chksum
    if UDP in out:
        out[UDP].dport = int(port)
        if packet[UDP].chksum != 0:
            del out[UDP].chksum
    del out[IP].chksum
    return bytes(Ether(bytes(out)))


def _backend_of(raw: bytes) -> str:
    pkt = Ether(raw)
    l4 = pkt[TCP] if TCP in pkt else pkt[UDP]
    return f"{pkt[IP].dst}:{l4.dport}"


@dataclass
class Case:
    name: str
    packet: object
    action: int
    verdict: Verdict
    meta: int = 0  # leading bytes handed over as XDP metadata


def _tcp(dst=VIP, dport=80, sport=40000, flags="S", **ip):
    return L2 / IP(src=CLIENT, dst=dst, **ip) / TCP(sport=sport, dport=dport, flags=flags)


UNTOUCHED = [
    Case("non-VIP IPv4", _tcp(dst="10.5.5.5"), XDP_PASS, Verdict.PASS_NOT_VIP),
    Case("ARP", L2 / ARP(psrc=CLIENT, pdst=VIP), XDP_PASS, Verdict.PASS_NOT_IPV4),
    Case("IPv6", L2 / IPv6(src="fd00::2", dst="fd00::1") / TCP(dport=80), XDP_PASS, Verdict.PASS_NOT_IPV4),
    Case("ICMP timestamp to a VIP", L2 / IP(src=CLIENT, dst=VIP) / ICMP(type=13), XDP_PASS, Verdict.PASS_NOT_TCP_UDP),
    Case("GRE to a VIP", L2 / IP(src=CLIENT, dst=VIP, proto=47) / Raw(b"\0" * 8), XDP_PASS, Verdict.PASS_NOT_TCP_UDP),
    Case("VIP on an unknown port goes to the stack", _tcp(dport=81), XDP_PASS, Verdict.PASS_UNKNOWN_PORT),
    Case("UDP to the TCP-only port goes to the stack", L2 / IP(src=CLIENT, dst=VIP) / UDP(sport=5, dport=80),
         XDP_PASS, Verdict.PASS_UNKNOWN_PORT),
    Case("fragment to a non-VIP", L2 / IP(src=CLIENT, dst="10.5.5.5", frag=3, proto=6) / Raw(b"x" * 8),
         XDP_PASS, Verdict.PASS_NOT_VIP),
    Case("IP options to a non-VIP", _tcp(dst="10.5.5.5", options=[IPOption_RR()]), XDP_PASS, Verdict.PASS_NOT_VIP),
]

DROPPED = [
    Case("Ethernet header alone", bytes(_tcp())[:14], XDP_DROP, Verdict.DROP_TRUNCATED),
    Case("truncated IPv4", bytes(_tcp())[:14 + 12], XDP_DROP, Verdict.DROP_TRUNCATED),
    Case("truncated TCP", bytes(_tcp())[:14 + 20 + 10], XDP_DROP, Verdict.DROP_TRUNCATED),
    Case("truncated UDP", bytes(L2 / IP(src=CLIENT, dst=VIP) / UDP(dport=53))[:14 + 20 + 6], XDP_DROP,
         Verdict.DROP_TRUNCATED),
    Case("IP options to a VIP", _tcp(options=[IPOption_RR()]), XDP_DROP, Verdict.DROP_IP_OPTIONS),
    Case("first fragment to a VIP", L2 / IP(src=CLIENT, dst=VIP, flags="MF") / TCP(sport=40001, dport=80), XDP_DROP, Verdict.DROP_FRAGMENT),
    Case("later fragment to a VIP", L2 / IP(src=CLIENT, dst=VIP, frag=3, proto=6) / Raw(b"y" * 24), XDP_DROP,
         Verdict.DROP_FRAGMENT),
    Case("VIP whose backends all have weight 0", _tcp(dst=ZERO_VIP), XDP_DROP, Verdict.DROP_NO_BACKEND),
]


@pytest.mark.parametrize("case", UNTOUCHED, ids=lambda c: c.name)
def test_other_traffic_passes_untouched(dp, case):
    packet = bytes(case.packet)
    result, changed = _run(dp, packet, case.meta)
    assert result.retval == case.action
    assert changed == {case.verdict.name.lower(): 1}
    assert result.output == packet


@pytest.mark.parametrize("case", DROPPED, ids=lambda c: c.name)
def test_malformed_or_unserved_traffic_is_dropped(dp, case):
    packet = bytes(case.packet)
    result, changed = _run(dp, packet, case.meta)
    assert result.retval == case.action
    assert changed == {case.verdict.name.lower(): 1}


def test_frames_shorter_than_ethernet_never_reach_the_program(dp):
    # The kernel refuses them (the XDP program keeps its own check for the
    # verifier's sake): a truncated Ethernet header cannot be mis-forwarded.
    before = dp.verdict_counters()
    with pytest.raises(OSError):
        run_xdp(dp.xdp_fd, bytes(_tcp())[:16], meta=4)
    assert dp.verdict_counters() == before


def test_tcp_syn_then_established_go_to_one_backend(dp):
    syn = _tcp(sport=41000, flags="S")
    result, changed = _run(dp, bytes(syn))
    assert result.retval == XDP_PASS
    assert changed == {"fwd_new_flow": 1}
    backend = _backend_of(result.output)
    assert backend in WEB
    assert result.output == _dnat(syn, backend)
    assert _valid(result.output)

    ack = _tcp(sport=41000, flags="A") / Raw(b"GET / HTTP/1.1\r\n\r\n")
    result, changed = _run(dp, bytes(ack))
    assert changed == {"fwd_established": 1}
    assert result.output == _dnat(ack, backend)
    assert _valid(result.output)


def test_udp_to_a_vip_is_dnated_with_valid_checksum(dp):
    for sport, checksum in ((5001, None), (5002, 0)):
        pkt = L2 / IP(src=CLIENT, dst=VIP) / UDP(sport=sport, dport=53) / Raw(b"query")
        if checksum == 0:
            pkt = Ether(bytes(pkt))
            pkt[UDP].chksum = 0
        result, changed = _run(dp, bytes(pkt))
        assert result.retval == XDP_PASS
        assert changed == {"fwd_new_flow": 1}
        assert result.output == _dnat(pkt, "10.1.0.21:5353")
        assert _valid(result.output)
        assert (Ether(result.output)[UDP].chksum == 0) == (checksum == 0)


def test_tc_program_restores_the_vip_on_replies(dp):
    syn = _tcp(sport=42000)
    backend = _backend_of(_run(dp, bytes(syn))[0].output)
    ip, port = backend.split(":")
    reply = Ether() / IP(src=ip, dst=CLIENT) / TCP(sport=int(port), dport=42000, flags="SA") / Raw(b"hi")
    result = run_xdp(dp._prog.tc.fd, bytes(reply))
    assert result.retval == TC_ACT_OK
    out = Ether(result.output)
    assert (out[IP].src, out[TCP].sport, out[IP].dst, out[TCP].dport) == (VIP, 80, CLIENT, 42000)
    assert _valid(result.output)
    # a packet that is no reply of a known flow is left alone
    other = bytes(Ether() / IP(src="10.7.7.7", dst=CLIENT) / TCP(sport=1, dport=2))
    assert run_xdp(dp._prog.tc.fd, other).output == other


def test_weight_zero_and_draining_take_no_new_flows_but_keep_established(dp):
    flows = [_tcp(sport=43000 + i) for i in range(60)]
    first = {f[TCP].sport: _backend_of(run_xdp(dp.xdp_fd, bytes(f)).output) for f in flows}
    heavy = "10.1.0.13:8080"
    assert heavy in first.values()
    assert dp.put_service(VIP, 80, "tcp", WEB | {heavy: 0}, draining=["10.1.0.12:8080"]) is True
    try:
        new = [_backend_of(run_xdp(dp.xdp_fd, bytes(_tcp(sport=44000 + i))).output) for i in range(120)]
        assert set(new) == {"10.1.0.11:8080"}
        for f in flows:  # established flows stay where they were
            assert _backend_of(run_xdp(dp.xdp_fd, bytes(_tcp(sport=f[TCP].sport, flags="A"))).output) \
                == first[f[TCP].sport]
    finally:
        dp.put_service(VIP, 80, "tcp", WEB)


def test_unchanged_service_is_not_rewritten_and_changes_switch_rings(dp):
    before = dp.get_service(VIP, 80, "tcp")
    assert dp.put_service(VIP, 80, "tcp", dict(reversed(list(WEB.items())))) is False
    assert dp.get_service(VIP, 80, "tcp").active_ring == before.active_ring
    assert dp.put_service(VIP, 80, "tcp", WEB | {"10.1.0.14:8080": 1}) is True
    after = dp.get_service(VIP, 80, "tcp")
    assert after.active_ring == 1 - before.active_ring
    shares = {b.address: b.slots for b in after.backends}
    assert shares["10.1.0.14:8080"] * 8 == pytest.approx(65537, abs=8)
    assert dp.put_service(VIP, 80, "tcp", WEB) is True
    assert "10.1.0.14:8080" not in {b.address for b in dp.get_service(VIP, 80, "tcp").backends}


def test_source_nat_forward_and_reply(snat_dp):
    syn = _tcp(sport=45000)
    result, changed = _run(snat_dp, bytes(syn))
    assert changed == {"fwd_new_flow": 1}
    out = Ether(result.output)
    assert (out[IP].src, out[IP].dst, out[TCP].dport) == (NODE_IP, "10.3.0.5", 8080)
    snat_port = out[TCP].sport
    assert 61000 <= snat_port < 65536
    assert _valid(result.output)

    reply = L2 / IP(src="10.3.0.5", dst=NODE_IP) / TCP(sport=8080, dport=snat_port, flags="SA")
    result, changed = _run(snat_dp, bytes(reply))
    assert result.retval == XDP_PASS
    assert changed == {"reply_snat": 1}
    back = Ether(result.output)
    assert (back[IP].src, back[TCP].sport, back[IP].dst, back[TCP].dport) == (VIP, 80, CLIENT, 45000)
    assert _valid(result.output)

    # a packet to node_ip that belongs to no source-NAT flow is the node's own traffic
    own = bytes(L2 / IP(src="10.3.0.5", dst=NODE_IP) / TCP(sport=8080, dport=22))
    result, changed = _run(snat_dp, own)
    assert changed == {"pass_not_vip": 1} and result.output == own
