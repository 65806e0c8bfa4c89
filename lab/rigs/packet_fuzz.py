"""Random and mutated frames through the XDP and TC programs (BPF_PROG_TEST_RUN): shared by
tests/dataplane/test_dataplane_fuzz.py (a few hundred frames, fixed seed) and scripts/fuzz-packets
(many more, JSON summary).

Frames start from valid ones (TCP SYN/ACK/RST/FIN, UDP, ICMP echo and errors to a VIP, traffic
to other addresses and to the node address, ARP, IPv6) and are then mutated the ways an attacker
or a broken NIC would: truncated at any byte, IHL from 0 to 15, IP options, fragments, a total
length that disagrees with the frame, VLAN and QinQ tags, odd protocol numbers, flipped header
bytes, or frames of random bytes. For every frame:

  - the XDP action is DROP, PASS, TX or REDIRECT (never ABORTED nor an undefined number), and
    exactly one verdict counter moved, by one; TC answers OK or SHOT;
  - a frame that is invalid by construction (headers cut short, IHL under 5, a fragment, IP
    options: ``invalid_reason``) gets no forwarding verdict and creates no flow or reverse-flow
    entry; no frame at all creates a flow unless its verdict says it recorded one;
  - running the program never fails (the kernel's test run returns an error only for frames
    shorter than Ethernet, which the generator does not make).

Expectations are stated on the defined verdict set, not on XDP_PASS vs XDP_TX/REDIRECT, so they
hold whichever way forwarding is done.
"""

from __future__ import annotations

import collections
import random
import struct
from dataclasses import dataclass, field

from scapy.all import ARP, ICMP, IP, TCP, UDP, Dot1Q, Ether, IPOption_RR, IPv6, Raw

from agent.dataplane import Verdict
from agent.dataplane.testrun import XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX, run_xdp

VIP = "10.9.20.1"  # its own VIP: the plane may be the session-shared one
CLIENT = "10.0.0.2"
NODE_IP = "10.2.0.1"
BACKENDS = {"10.1.0.11:8080": 1, "10.1.0.12:8080": 3}
DNS = {"10.1.0.21:5353": 1}
XDP_ACTIONS = {XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT}
TC_ACTIONS = {0, 2}  # TC_ACT_OK, TC_ACT_SHOT
IP_HEADER = {b"\x08\x00": 20, b"\x86\xdd": 40}  # EtherType -> the header a test skb must hold
# Verdicts after which a flow (and for source NAT a reverse entry) may have been recorded.
RECORDING = {Verdict.FWD_NEW_FLOW, Verdict.FWD_MISS_RECORDED, Verdict.FWD_REPICKED, Verdict.FWD_ESTABLISHED}
FORWARDING = {v for v in Verdict if v.name.startswith(("FWD_", "REPLY_"))}
L2 = Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02")


def setup_services(plane) -> None:
    plane.put_service(VIP, 80, "tcp", BACKENDS)
    plane.put_service(VIP, 53, "udp", DNS)


def _base(rng: random.Random) -> bytes:
    sport = rng.randrange(1024, 60000)
    dst = rng.choice([VIP, VIP, VIP, "10.5.5.5", NODE_IP])
    kind = rng.randrange(9)
    if kind <= 3:
        flags = ["S", "A", "R", "FA"][kind]
        return bytes(L2 / IP(src=CLIENT, dst=dst) / TCP(sport=sport, dport=rng.choice([80, 80, 81]), flags=flags)
                     / Raw(b"x" * rng.randrange(0, 40)))
    if kind == 4:
        return bytes(L2 / IP(src=CLIENT, dst=dst) / UDP(sport=sport, dport=rng.choice([53, 54])) / Raw(b"q" * 8))
    if kind == 5:
        return bytes(L2 / IP(src=CLIENT, dst=dst) / ICMP(type=rng.choice([0, 3, 8, 11, 13])) / Raw(b"p" * 28))
    if kind == 6:  # an ICMP error quoting a VIP flow (or garbage)
        inner = IP(src=dst, dst=CLIENT) / TCP(sport=80, dport=sport)
        return bytes(L2 / IP(src="10.7.7.7", dst=dst) / ICMP(type=3, code=4) / bytes(inner)[:rng.choice([8, 20, 28])])
    if kind == 7:  # a backend's reply to the node address (the source-NAT reply path)
        return bytes(L2 / IP(src="10.1.0.11", dst=NODE_IP) / TCP(sport=8080, dport=rng.randrange(61000, 65536),
                                                                  flags="SA"))
    return bytes(rng.choice([L2 / ARP(psrc=CLIENT, pdst=VIP), L2 / IPv6(src="fd00::2", dst="fd00::1") / TCP()]))


def _set_ip(frame: bytearray, offset: int, ihl: int | None = None, tot_len: int | None = None,
            frag: int | None = None) -> None:
    if ihl is not None:
        frame[offset] = (frame[offset] & 0xF0) | ihl
    if tot_len is not None:
        frame[offset + 2:offset + 4] = struct.pack("!H", tot_len)
    if frag is not None:
        frame[offset + 6:offset + 8] = struct.pack("!H", frag)


MUTATIONS = ("none", "truncate", "ihl", "options", "fragment", "tot_len", "vlan", "protocol", "flip", "random")


@dataclass
class Frame:
    data: bytes
    mutation: str
    invalid: str | None  # why the frame is invalid by construction, when it is


def invalid_reason(data: bytes) -> str | None:
    """Why a frame is invalid by construction for the program (None: it may be served)."""
    if len(data) < 14 or data[12:14] != b"\x08\x00":
        return None  # not IPv4 (VLAN-tagged frames included): passed untouched, never served
    ip = data[14:]
    if len(ip) < 20:
        return "truncated IPv4 header"
    ihl = ip[0] & 0x0F
    if ip[0] >> 4 != 4:
        return None  # the program reads only the IPv4 EtherType; a bad version is its choice
    if ihl < 5:
        return "IHL under 5"
    frag = struct.unpack("!H", ip[6:8])[0]
    if frag & 0x3FFF:
        return "fragment"
    if ihl > 5:
        return "IP options"
    l4 = {6: 20, 17: 8}.get(ip[9])
    if l4 is not None and len(ip) < 20 + l4:
        return "truncated L4 header"
    return None


def mutate(rng: random.Random, base: bytes) -> Frame:
    kind = rng.choice(MUTATIONS)
    frame = bytearray(base)
    is_ip = len(frame) >= 34 and frame[12:14] == b"\x08\x00"
    if kind == "truncate":
        frame = frame[:rng.randrange(14, max(15, len(frame)))]
    elif kind == "ihl" and is_ip:
        _set_ip(frame, 14, ihl=rng.randrange(16))
    elif kind == "options" and is_ip:
        pkt = Ether(bytes(frame))
        pkt[IP].options = [IPOption_RR()]
        del pkt[IP].ihl, pkt[IP].len, pkt[IP].chksum
        frame = bytearray(bytes(pkt))
    elif kind == "fragment" and is_ip:
        _set_ip(frame, 14, frag=rng.choice([0x2000, 0x0001, 0x2003, 0x1FFF, 0x4000 | 0x0002]))
    elif kind == "tot_len" and is_ip:
        _set_ip(frame, 14, tot_len=rng.choice([0, 19, 20, 21, len(frame) - 14 + rng.randrange(1, 2000), 0xFFFF]))
    elif kind == "vlan":
        pkt = Ether(bytes(frame))
        tags = Dot1Q(vlan=rng.randrange(4096)) if rng.random() < 0.7 else Dot1Q(vlan=7) / Dot1Q(vlan=8)
        frame = bytearray(bytes(Ether(dst=pkt.dst, src=pkt.src) / tags / pkt.payload))
    elif kind == "protocol" and is_ip:
        frame[14 + 9] = rng.choice([0, 2, 4, 41, 47, 50, 58, 132, 255])
    elif kind == "flip":
        for _ in range(rng.randrange(1, 6)):
            at = rng.randrange(12, min(len(frame), 14 + 60))
            frame[at] ^= 1 << rng.randrange(8)
    elif kind == "random":
        frame = bytearray(base[:12] + b"\x08\x00" + rng.randbytes(rng.randrange(0, 80)))
    data = bytes(frame)
    return Frame(data, kind, invalid_reason(data))


def frames(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        yield mutate(rng, _base(rng))


@dataclass
class Report:
    frames: int = 0
    xdp_actions: dict[str, int] = field(default_factory=dict)
    verdicts: dict[str, int] = field(default_factory=dict)
    mutations: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=dict)
    tc_actions: dict[str, int] = field(default_factory=dict)
    flows_created: int = 0
    problems: list[str] = field(default_factory=list)


def _entries(table) -> int:
    return sum(1 for _ in table)


ACTION_NAMES = {XDP_DROP: "drop", XDP_PASS: "pass", XDP_TX: "tx", XDP_REDIRECT: "redirect"}


def fuzz(plane, seed: int, count: int, max_problems: int = 20) -> Report:
    """Every frame through XDP then TC on `plane` (services from setup_services); the Report."""
    report = Report()
    actions, verdicts, mutations, invalid, tc = (collections.Counter() for _ in range(5))
    for frame in frames(seed, count):
        report.frames += 1
        mutations[frame.mutation] += 1
        flows_before, reverse_before = _entries(plane._flows), _entries(plane._reverse)
        before = plane.verdict_counters()
        result = run_xdp(plane.xdp_fd, frame.data)
        after = plane.verdict_counters()
        moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        flows_after, reverse_after = _entries(plane._flows), _entries(plane._reverse)
        made = (flows_after - flows_before) + (reverse_after - reverse_before)
        report.flows_created += max(0, flows_after - flows_before)
        actions[ACTION_NAMES.get(result.retval, str(result.retval))] += 1
        verdict = Verdict[next(iter(moved)).upper()] if len(moved) == 1 else None
        verdicts[verdict.name.lower() if verdict is not None else "none"] += 1
        problem = None
        if result.retval not in XDP_ACTIONS:
            problem = f"XDP action {result.retval}"
        elif len(moved) != 1 or sum(moved.values()) != 1:
            problem = f"verdict counters moved {moved}"
        elif frame.invalid and verdict in FORWARDING:
            problem = f"invalid frame ({frame.invalid}) got {verdict.name}"
        elif made > 0 and (frame.invalid or verdict not in RECORDING):
            problem = f"{made} flow entries made by a {verdict.name} frame ({frame.invalid or 'valid'})"
        if frame.invalid:
            invalid[frame.invalid] += 1
        tc_before = _entries(plane._flows) + _entries(plane._reverse)
        try:
            tc_result = run_xdp(plane._prog.tc.fd, frame.data)
        except OSError as exc:
            # The kernel builds a test skb only around a whole IPv4 or IPv6 header (so does the
            # stack that hands packets to TC): shorter IP frames never reach the program.
            tc["refused by the kernel"] += 1
            if not (len(frame.data) < 14 + IP_HEADER.get(frame.data[12:14], 0)) and not problem:
                problem = f"TC test run failed: {exc}"
            tc_result = None
        if tc_result is not None:
            tc[str(tc_result.retval)] += 1
            if tc_result.retval not in TC_ACTIONS:
                problem = problem or f"TC action {tc_result.retval}"
            elif _entries(plane._flows) + _entries(plane._reverse) != tc_before:
                problem = problem or "TC changed the flow tables"
        if problem and len(report.problems) < max_problems:
            report.problems.append(f"{problem}: {frame.mutation} frame {frame.data.hex()}")
    report.xdp_actions, report.verdicts = dict(actions), dict(sorted(verdicts.items()))
    report.mutations, report.invalid, report.tc_actions = dict(mutations), dict(invalid), dict(tc)
    return report
