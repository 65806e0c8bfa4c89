"""The XDP/TC fast paths of docs/dataplane.md through BPF_PROG_TEST_RUN: the
vip_filter bitmap and its collisions, service_slots (a deleted service stops its
flows, a re-created one keeps them), backend_addrs (the TC reply path for shared
and removed backends) and the repair of those derived maps when their pins are
missing. Packet-table style as test_dataplane_packets.py, whose helpers these
tests reuse: scapy input, expected action and verdict, expected output bytes with
valid checksums."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from scapy.all import ICMP, IP, TCP, UDP, Ether, IPOption_RR, Raw

from agent.dataplane import Dataplane, Verdict
from agent.dataplane.addresses import ip_to_map, port_to_map, service_address
from agent.dataplane.loader import BPF_DIR
from agent.dataplane.testrun import XDP_PASS, run_xdp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_dataplane_packets import L2, TC_ACT_OK, _backend_of, _dnat, _run, _valid

from lab.rigs.bpf import new_pin_dir, open_dataplane

CLIENT = "10.0.0.2"
VIP = "10.9.0.100"  # the module's main VIP: tcp/80 and udp/53
WEB = {"10.1.0.11:8080": 1, "10.1.0.12:8080": 2, "10.1.0.13:8080": 4}
DNS = {"10.1.0.21:5353": 1}
SNAT_VIP = "10.9.5.1"
SNAT_BACKEND = "10.3.0.5:8080"  # no bridge route on this host: source-NATed when node_ip is set


# -- the filter hash, computed here the way xdp_maglev computes it ------------

def _maps_h_constant(name: str) -> int:
    text = (BPF_DIR / "maps.h").read_text()
    return int(re.search(rf"#define {name} (\w+?)u?\b", text).group(1), 0)


FILTER_BITS = _maps_h_constant("VIP_FILTER_BITS")
FILTER_MULT = _maps_h_constant("VIP_FILTER_MULT")
FILTER_SHIFT = _maps_h_constant("VIP_FILTER_SHIFT")


def filter_bit(ip: str) -> int:
    """((__u32)daddr * VIP_FILTER_MULT) >> VIP_FILTER_SHIFT, daddr being the
    network-order address loaded as a host (little-endian) u32."""
    daddr = int.from_bytes(bytes(int(x) for x in ip.split(".")), "little")
    return ((daddr * FILTER_MULT) & 0xFFFFFFFF) >> FILTER_SHIFT


def _filter_bits_set(plane: Dataplane) -> set[int]:
    words = plane._vip_filter[ctypes.c_uint32(0)].words
    return {i * 64 + b for i in range(FILTER_BITS // 64) for b in range(64) if words[i] >> b & 1}


def _vips(plane: Dataplane) -> set[int]:
    return {k.value for k in plane._vips}


def _colliding(target: str, prefix: str, avoid: set[int] = frozenset()) -> str:
    """First prefix.X.Y whose filter bit is target's."""
    want = filter_bit(target)
    for n in range(1, 65536):
        ip = f"{prefix}.{n >> 8}.{n & 255}"
        if filter_bit(ip) == want and ip != target and ip_to_map(ip) not in avoid:
            return ip
    raise AssertionError(f"no address in {prefix}.0.0/16 collides with {target}")


def _program_filter_admits(plane: Dataplane, addr: str) -> bool:
    """Whether xdp_maglev's own filter test lets `addr` through, seen from outside:
    with addr briefly in `vips` (the filter untouched), a packet to a port without
    a service is dropped as an unknown port only if the filter bit was set."""
    key = plane._vips.Key(ip_to_map(addr))
    assert plane._vips.get(key) is None, f"{addr} is a VIP"
    plane._vips[key] = plane._vips.Leaf(1)
    try:
        _, changed = _run(plane, bytes(L2 / IP(src=CLIENT, dst=addr) / TCP(sport=1, dport=9)))
    finally:
        del plane._vips[key]
    assert changed in ({"pass_unknown_port": 1}, {"pass_not_vip": 1}), changed
    return changed == {"pass_unknown_port": 1}


# -- small helpers -------------------------------------------------------------

def _tcp(dst: str, dport: int, sport: int, flags: str = "S", src: str = CLIENT):
    return L2 / IP(src=src, dst=dst) / TCP(sport=sport, dport=dport, flags=flags)


def _ack(dst: str, dport: int, sport: int):
    return _tcp(dst, dport, sport, flags="A") / Raw(b"more data")


def _reply(backend: str, client_port: int, client: str = CLIENT):
    ip, port = backend.split(":")
    return L2 / IP(src=ip, dst=client) / TCP(sport=int(port), dport=client_port, flags="A") / Raw(b"reply")


def _restored(reply, vip: str, vport: int) -> bytes:
    """The reply as tc_reverse_nat must leave it: source VIP:port, checksums valid."""
    out = reply.copy()
    out[IP].src = vip
    out[TCP].sport = vport
    del out[IP].chksum
    del out[TCP].chksum
    return bytes(Ether(bytes(out)))


def _tc(plane: Dataplane, packet) -> bytes:
    result = run_xdp(plane._prog.tc.fd, bytes(packet))
    assert result.retval == TC_ACT_OK
    return result.output


def _open_flows(plane: Dataplane, vip: str, port: int, sports, expect: set[str] | None = None) -> dict[int, str]:
    """SYN per client port; returns client port -> backend (each a new flow, DNAT checked)."""
    out = {}
    for sport in sports:
        syn = _tcp(vip, port, sport)
        result, changed = _run(plane, bytes(syn))
        assert result.retval == XDP_PASS and changed == {"fwd_new_flow": 1}, (sport, changed)
        backend = _backend_of(result.output)
        assert result.output == _dnat(syn, backend) and _valid(result.output)
        out[sport] = backend
    if expect is not None:
        assert set(out.values()) <= expect
    return out


def _assert_established(plane: Dataplane, vip: str, port: int, flows: dict[int, str]) -> None:
    for sport, backend in flows.items():
        ack = _ack(vip, port, sport)
        result, changed = _run(plane, bytes(ack))
        assert result.retval == XDP_PASS and changed == {"fwd_established": 1}, (sport, changed)
        assert result.output == _dnat(ack, backend), (sport, backend, _backend_of(result.output))
        assert _valid(result.output)


def _service_id(plane: Dataplane, vip: str, port: int, proto: str = "tcp") -> int:
    return plane._services[plane._service_key(service_address(vip, port, proto))].id


def _flow_entry(plane: Dataplane, vip: str, port: int, sport: int):
    flows = plane._prog.bpf[b"flows"]
    key = flows.Key()
    key.src, key.dst = ip_to_map(CLIENT), ip_to_map(vip)
    key.sport, key.dport, key.proto = port_to_map(sport), port_to_map(port), 6
    return flows.get(key)


def _backend_addr_mask(plane: Dataplane, backend: str) -> int:
    ip, port = backend.split(":")
    key = plane._backend_addrs.Key()
    key.ip, key.port = ip_to_map(ip), port_to_map(int(port))
    mask = plane._backend_addrs.get(key)
    return mask.value if mask is not None else 0


def _slot(plane: Dataplane, service_id: int) -> tuple[int, int, int, int]:
    s = plane._service_slots[ctypes.c_uint32(service_id)]
    return s.vip, s.port, s.proto, s.pad


# -- fixtures ------------------------------------------------------------------

@pytest.fixture(scope="module")
def dp(plain_plane):
    """The session's loaded program (tests/conftest.py: no compile of its own) with VIP's two
    services for the module; each test adds (and deletes) its own VIPs."""
    plain_plane.put_service(VIP, 80, "tcp", WEB)
    plain_plane.put_service(VIP, 53, "udp", DNS)
    yield plain_plane
    plain_plane.delete_service(VIP, 80, "tcp")
    plain_plane.delete_service(VIP, 53, "udp")


# -- 1. vip_filter collisions --------------------------------------------------

@dataclass
class FilterCase:
    name: str
    build: object  # dst -> scapy packet
    vip_verdict: Verdict  # what the same packet to the VIP gets (a different path)


FILTER_CASES = [
    FilterCase("TCP to a port the VIP serves", lambda d: _tcp(d, 80, 46001), Verdict.FWD_NEW_FLOW),
    FilterCase("TCP to a port the VIP does not serve", lambda d: _tcp(d, 81, 46002), Verdict.PASS_UNKNOWN_PORT),
    FilterCase("UDP to the VIP's UDP port", lambda d: L2 / IP(src=CLIENT, dst=d) / UDP(sport=46003, dport=53)
               / Raw(b"q"), Verdict.FWD_NEW_FLOW),
    FilterCase("ICMP timestamp", lambda d: L2 / IP(src=CLIENT, dst=d) / ICMP(type=13), Verdict.PASS_NOT_TCP_UDP),
    FilterCase("ICMP echo", lambda d: L2 / IP(src=CLIENT, dst=d) / ICMP(), Verdict.REPLY_ICMP_ECHO),
    FilterCase("IP options", lambda d: L2 / IP(src=CLIENT, dst=d, options=[IPOption_RR()])
               / TCP(sport=46004, dport=80), Verdict.DROP_IP_OPTIONS),
    FilterCase("first fragment", lambda d: L2 / IP(src=CLIENT, dst=d, flags="MF") / TCP(sport=46005, dport=80),
               Verdict.DROP_FRAGMENT),
    FilterCase("later fragment", lambda d: L2 / IP(src=CLIENT, dst=d, frag=3, proto=6) / Raw(b"y" * 24),
               Verdict.DROP_FRAGMENT),
    FilterCase("truncated TCP", lambda d: Ether(bytes(_tcp(d, 80, 46006))[:14 + 20 + 10]), Verdict.DROP_TRUNCATED),
    FilterCase("truncated UDP", lambda d: Ether(bytes(L2 / IP(src=CLIENT, dst=d) / UDP(dport=53))[:14 + 20 + 6]),
               Verdict.DROP_TRUNCATED),
]


@pytest.fixture(scope="module")
def filter_addrs(dp):
    """(collider, control): a non-VIP whose filter bit is VIP's, and one whose bit is clear."""
    vips = _vips(dp)
    collider = _colliding(VIP, "10.77", avoid=vips)
    # the address really collides: same bit by the C formula, that bit is set in
    # the map, and the loaded program itself lets the address past its filter
    assert filter_bit(collider) == filter_bit(VIP) and ip_to_map(collider) not in vips
    assert filter_bit(VIP) in _filter_bits_set(dp)
    assert _program_filter_admits(dp, collider), f"{collider} does not pass the program's filter"
    control = next(f"10.78.0.{n}" for n in range(1, 255) if filter_bit(f"10.78.0.{n}") not in _filter_bits_set(dp))
    assert not _program_filter_admits(dp, control)
    return collider, control


@pytest.mark.parametrize("case", FILTER_CASES, ids=lambda c: c.name)
def test_filter_collision_gets_the_non_vip_verdict_and_stays_untouched(dp, filter_addrs, case):
    collider, control = filter_addrs
    bits = _filter_bits_set(dp)
    assert filter_bit(collider) in bits and filter_bit(control) not in bits
    for dst in (control, collider):
        packet = bytes(case.build(dst))
        result, changed = _run(dp, packet)
        assert (result.retval, changed) == (XDP_PASS, {"pass_not_vip": 1}), dst
        assert result.output == packet, dst
    # the same packet to the VIP takes another path: the collider did not just happen to agree
    _, changed = _run(dp, bytes(case.build(VIP)))
    assert changed == {case.vip_verdict.name.lower(): 1}


def test_filter_collision_with_node_ip_keeps_source_nat_replies(require_bpf):
    """node_ip is the one non-VIP address the filter holds (its source-NAT replies are
    translated in XDP): a node_ip whose bit is also a VIP's must still get its
    source-NAT replies rewritten and its own traffic untouched."""
    node_ip = _colliding(SNAT_VIP, "10.2")
    assert filter_bit(node_ip) == filter_bit(SNAT_VIP)
    pin_dir = new_pin_dir()
    plane = open_dataplane(pin_dir, node_ip)
    try:
        plane.put_service(SNAT_VIP, 80, "tcp", {SNAT_BACKEND: 1})
        assert filter_bit(node_ip) in _filter_bits_set(plane)

        syn = _tcp(SNAT_VIP, 80, 47000)
        result, changed = _run(plane, bytes(syn))
        assert changed == {"fwd_new_flow": 1}
        out = Ether(result.output)
        assert (out[IP].src, out[IP].dst, out[TCP].dport) == (node_ip, "10.3.0.5", 8080) and _valid(result.output)
        snat_port = out[TCP].sport

        reply = L2 / IP(src="10.3.0.5", dst=node_ip) / TCP(sport=8080, dport=snat_port, flags="SA") / Raw(b"r")
        result, changed = _run(plane, bytes(reply))
        assert (result.retval, changed) == (XDP_PASS, {"reply_snat": 1})
        want = reply.copy()
        want[IP].src, want[IP].dst, want[TCP].sport, want[TCP].dport = SNAT_VIP, CLIENT, 80, 47000
        del want[IP].chksum, want[TCP].chksum
        assert result.output == bytes(Ether(bytes(want))) and _valid(result.output)

        for own in (L2 / IP(src="10.3.0.5", dst=node_ip) / TCP(sport=8080, dport=22),
                    L2 / IP(src="10.3.0.5", dst=node_ip) / ICMP()):
            result, changed = _run(plane, bytes(own))
            assert (result.retval, changed) == (XDP_PASS, {"pass_not_vip": 1})
            assert result.output == bytes(own)
    finally:
        plane.close()
        shutil.rmtree(pin_dir, ignore_errors=True)


def test_deleting_a_vip_that_shares_a_filter_bit_keeps_the_other_vip(dp):
    """Two VIPs on one bit: the bit must stay while either exists (the filter is
    rebuilt from vips, never cleared per VIP)."""
    other = _colliding(VIP, "10.79", avoid=_vips(dp))
    assert filter_bit(other) == filter_bit(VIP)
    dp.put_service(other, 80, "tcp", {"10.1.0.81:8080": 1})
    try:
        _open_flows(dp, other, 80, [46100], expect={"10.1.0.81:8080"})
    finally:
        assert dp.delete_service(other, 80, "tcp") is True
    assert filter_bit(VIP) in _filter_bits_set(dp)
    _open_flows(dp, VIP, 80, [46101], expect=set(WEB))
    ack = bytes(_ack(other, 80, 46100))  # the deleted VIP's flow: now a non-VIP that collides
    result, changed = _run(dp, ack)
    assert (result.retval, changed, result.output) == (XDP_PASS, {"pass_not_vip": 1}, ack)


# -- 2. deleting and re-creating a service -------------------------------------

def test_deleted_service_stops_its_established_flows_and_recreated_one_keeps_them(dp):
    vip = "10.9.2.1"
    dp.put_service(vip, 80, "tcp", WEB)
    dp.put_service(vip, 53, "udp", DNS)  # the VIP stays a VIP after tcp/80 goes
    try:
        sid = _service_id(dp, vip, 80)
        flows = _open_flows(dp, vip, 80, range(48000, 48030), expect=set(WEB))
        assert len(set(flows.values())) > 1
        _assert_established(dp, vip, 80, flows)

        assert dp.delete_service(vip, 80, "tcp") is True
        assert _slot(dp, sid) == (0, 0, 0, 0)
        for sport in flows:
            result, changed = _run(dp, bytes(_ack(vip, 80, sport)))
            assert (result.retval, changed) == (XDP_PASS, {"pass_unknown_port": 1}), sport

        # re-created (same id, other weights: Maglev alone would move many of these flows)
        assert dp.put_service(vip, 80, "tcp", {"10.1.0.11:8080": 4, "10.1.0.12:8080": 1, "10.1.0.13:8080": 1})
        assert _service_id(dp, vip, 80) == sid
        _assert_established(dp, vip, 80, flows)
        # the replies are restored too
        sport, backend = next(iter(flows.items()))
        assert _tc(dp, _reply(backend, sport)) == _restored(_reply(backend, sport), vip, 80)
    finally:
        dp.delete_service(vip, 80, "tcp")
        dp.delete_service(vip, 53, "udp")


def test_service_recreated_under_another_id_keeps_its_flows_and_repairs_their_id(dp):
    vip, filler = "10.9.2.3", "10.9.2.4"
    dp.put_service(vip, 80, "tcp", WEB)
    try:
        old_id = _service_id(dp, vip, 80)
        flows = _open_flows(dp, vip, 80, range(48100, 48120), expect=set(WEB))
        assert dp.delete_service(vip, 80, "tcp") is True
        dp.put_service(filler, 80, "tcp", {"10.1.0.41:8080": 1})  # takes the freed id
        assert _service_id(dp, filler, 80) == old_id

        # while deleted: the address is no VIP any more (unless another VIP shares its bit)
        assert ip_to_map(vip) not in _vips(dp)
        assert filter_bit(vip) not in _filter_bits_set(dp)
        sport = next(iter(flows))
        ack = bytes(_ack(vip, 80, sport))
        result, changed = _run(dp, ack)
        assert (result.retval, changed, result.output) == (XDP_PASS, {"pass_not_vip": 1}, ack)

        dp.put_service(vip, 80, "tcp", WEB)
        new_id = _service_id(dp, vip, 80)
        assert new_id != old_id
        assert _flow_entry(dp, vip, 80, sport).service_id == old_id  # stale until its next packet
        # the reply path finds the flow through the new id before any forward packet repairs it
        backend = flows[sport]
        assert _tc(dp, _reply(backend, sport)) == _restored(_reply(backend, sport), vip, 80)
        _assert_established(dp, vip, 80, flows)
        assert {_flow_entry(dp, vip, 80, s).service_id for s in flows} == {new_id}
        # the filler's flows are its own: its id's slot is no match for this VIP
        filler_flow = _open_flows(dp, filler, 80, [48200])
        _assert_established(dp, filler, 80, filler_flow)
    finally:
        dp.delete_service(vip, 80, "tcp")
        dp.delete_service(filler, 80, "tcp")


def test_service_recreated_without_a_flows_backend_repicks_those_flows(dp):
    """A re-created service keeps the flows to backends it still lists; a flow to
    a backend it no longer lists is picked again. Its old backend's replies are
    no longer translated: the address belongs to no service, so they are no
    nat flow's replies (the client's next packet re-picks the flow anyway)."""
    vip = "10.9.2.5"
    gone, stays = "10.1.0.71:8080", "10.1.0.72:8080"
    dp.put_service(vip, 80, "tcp", {gone: 1, stays: 1})
    try:
        flows = _open_flows(dp, vip, 80, range(48300, 48330), expect={gone, stays})
        on_gone = {p: b for p, b in flows.items() if b == gone}
        on_stays = {p: b for p, b in flows.items() if b == stays}
        assert on_gone and on_stays
        assert dp.delete_service(vip, 80, "tcp") is True
        dp.put_service(vip, 80, "tcp", {stays: 1})
        _assert_established(dp, vip, 80, on_stays)
        for sport in on_gone:
            reply = _reply(gone, sport)
            assert _tc(dp, reply) == bytes(reply)  # untouched
            ack = _ack(vip, 80, sport)
            result, changed = _run(dp, bytes(ack))
            assert changed == {"fwd_repicked": 1} and result.output == _dnat(ack, stays)
    finally:
        dp.delete_service(vip, 80, "tcp")


# -- 3. one backend shared by two services --------------------------------------

def test_reply_from_a_backend_shared_by_two_services_gets_each_flows_vip(dp):
    shared = "10.1.0.50:8080"
    s1, s2 = ("10.9.3.1", 80), ("10.9.3.2", 8443)
    dp.put_service(*s1, "tcp", {shared: 1})
    dp.put_service(*s2, "tcp", {shared: 1, "10.1.0.51:8080": 1})
    try:
        id1, id2 = _service_id(dp, *s1), _service_id(dp, *s2)
        assert _backend_addr_mask(dp, shared) == (1 << id1) | (1 << id2)
        f1 = _open_flows(dp, *s1, range(49000, 49004), expect={shared})
        f2 = {p: b for p, b in _open_flows(dp, *s2, range(49100, 49140)).items() if b == shared}
        assert len(f2) >= 2
        for flows, (vip, vport) in ((f1, s1), (f2, s2)):
            for sport in flows:
                reply = _reply(shared, sport)
                out = _tc(dp, reply)
                assert out == _restored(reply, vip, vport), (vip, vport, sport)
                assert _valid(out)
        # a client port with no flow through either service is left alone
        stray = bytes(_reply(shared, 49999))
        assert _tc(dp, stray) == stray

        # once s1 is gone the address belongs to s2 alone; s2's flows are untouched
        dp.delete_service(*s1, "tcp")
        assert _backend_addr_mask(dp, shared) == 1 << id2
        sport = next(iter(f2))
        assert _tc(dp, _reply(shared, sport)) == _restored(_reply(shared, sport), *s2)
    finally:
        dp.delete_service(*s1, "tcp")
        dp.delete_service(*s2, "tcp")


# -- 4. derived maps repaired on open -------------------------------------------

DERIVED = ("vip_filter", "service_slots", "backend_addrs")


def test_missing_derived_map_pins_are_repaired_and_services_keep_forwarding(pin_dir):
    vip = "10.9.6.1"
    first = open_dataplane(pin_dir)
    try:
        first.put_service(vip, 80, "tcp", WEB)
        first.put_service(vip, 53, "udp", DNS)
        sid = _service_id(first, vip, 80)
        flows = _open_flows(first, vip, 80, range(51000, 51020), expect=set(WEB))
        slot = _slot(first, sid)
        masks = {b: _backend_addr_mask(first, b) for b in WEB}
        bits = _filter_bits_set(first)
    finally:
        first.close()
    pins = set(os.listdir(pin_dir))
    assert set(DERIVED) <= pins
    for name in DERIVED:  # maps of an older layout: only these three are missing
        os.unlink(os.path.join(pin_dir, name))

    second = open_dataplane(pin_dir)
    try:
        assert set(os.listdir(pin_dir)) == pins
        assert _slot(second, sid) == slot and slot[3] == 1
        assert {b: _backend_addr_mask(second, b) for b in WEB} == masks == {b: 1 << sid for b in WEB}
        assert _filter_bits_set(second) == bits == {filter_bit(vip)}
        assert second.put_service(vip, 80, "tcp", WEB) is False  # found as it was

        _assert_established(second, vip, 80, flows)
        for sport, backend in list(flows.items())[:5]:
            reply = _reply(backend, sport)
            assert _tc(second, reply) == _restored(reply, vip, 80)
        _open_flows(second, vip, 80, [51100], expect=set(WEB))
        result, changed = _run(second, bytes(_tcp(vip, 81, 51101)))
        assert (result.retval, changed) == (XDP_PASS, {"pass_unknown_port": 1})
        udp = L2 / IP(src=CLIENT, dst=vip) / UDP(sport=51102, dport=53) / Raw(b"q")
        result, changed = _run(second, bytes(udp))
        assert changed == {"fwd_new_flow": 1} and result.output == _dnat(udp, "10.1.0.21:5353")
    finally:
        second.close()
