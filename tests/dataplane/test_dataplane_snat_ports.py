"""Source-NAT ports through BPF_PROG_TEST_RUN: flows that an under-mixing flow hash
would have put on one probe sequence still get a port each.

A flow's source-NAT probes are a function of its flow hash: flows with one hash try
the same 16 ports, so 17 of them to one backend ran out of ports however empty the
backend was (`drop_snat_exhausted` at ~22% occupancy in a bench run). The hash before
multiplied the tuple's words together without rotating, so the high halves of the
client address and the ports (the client's last two octets, the source port) met in
16 bits of state. These flows are built to collide under that hash; any hash that
mixes every bit of the tuple spreads them.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from scapy.all import IP, TCP, Ether

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_dataplane_packets import L2, _run, _valid

NODE_IP = "10.2.0.1"
VIP = "10.9.7.40"
ROUTED = "10.3.0.40:8080"  # no bridge route on this host: source-NATed
M = 0xFFFFFFFF


def _le32(ip: str) -> int:
    """An address as the program loads it (network bytes read as a little-endian word)."""
    return struct.unpack("<I", bytes(int(x) for x in ip.split(".")))[0]


def _port(key: int) -> int:
    """The port whose network bytes the program reads as the little-endian `key`."""
    return struct.unpack(">H", struct.pack("<H", key))[0]


def colliding_flows(count: int) -> list[tuple[str, int]]:
    """(client, source port) pairs for which the old hash's state is one value: the
    clients 10.0.0.k share their low half (10.0), and each source port cancels the
    client's high half in the state ((src * C1 ^ dst) * C2) ^ (sport << 16 | dport)."""
    dst = _le32(VIP)
    target = 0x1234
    flows = []
    for k in range(1, count + 1):
        client = f"10.0.0.{k}"
        state = (((_le32(client) * 0x9E3779B1) & M) ^ dst) * 0x85EBCA6B & M
        flows.append((client, _port((state >> 16) ^ target)))
    return flows


def test_snat_flows_sharing_the_old_hash_get_ports(snat_plane):
    dp = snat_plane
    assert dp.live_node_ip() == NODE_IP
    dp.put_service(VIP, 80, "tcp", {ROUTED: 1})
    try:
        ports = set()
        for client, sport in colliding_flows(24):
            assert sport != 0
            syn = L2 / IP(src=client, dst=VIP) / TCP(sport=sport, dport=80, flags="S")
            result, changed = _run(dp, bytes(syn))
            assert changed == {"fwd_new_flow": 1}, (client, sport, changed)
            out = Ether(result.output)
            assert (out[IP].src, out[IP].dst, out[TCP].dport) == (NODE_IP, "10.3.0.40", 8080)
            assert _valid(result.output)
            ports.add(out[TCP].sport)
        assert len(ports) == 24 and all(61000 <= p < 65536 for p in ports)
    finally:
        dp.delete_service(VIP, 80, "tcp")
