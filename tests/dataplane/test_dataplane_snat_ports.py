"""Source-NAT ports through BPF_PROG_TEST_RUN: flows that an under-mixing flow hash
would have put on one probe sequence still get a port each, and flows that meet on
one port part again at their next probe.

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
from test_dataplane_lifecycle import _key
from test_dataplane_packets import L2, _run, _valid

from agent.dataplane.addresses import ip_to_map

NODE_IP = "10.2.0.1"
VIP = "10.9.7.40"
ROUTED = "10.3.0.40:8080"  # no bridge route on this host: source-NATed
OTHER = "10.3.0.41:8080"
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


def _syn_port(dp, client: str, sport: int) -> int:
    syn = L2 / IP(src=client, dst=VIP) / TCP(sport=sport, dport=80, flags="S")
    result, changed = _run(dp, bytes(syn))
    assert changed == {"fwd_new_flow": 1}, changed
    return Ether(result.output)[TCP].sport


def test_snat_probe_steps_differ_between_flows(snat_plane):
    """Probe 1 minus probe 0, per flow: with one step shared by every flow the probes
    were a linear probe on one cycle (a flow meeting a taken port ran into every
    flow queued behind it: a backend half full failed 1 claim in 250); with the step
    drawn from the hash as well, flows part after meeting (1 in 40000)."""
    dp = snat_plane
    dp.put_service(VIP, 80, "tcp", {OTHER: 1})  # a backend no test used
    try:
        steps = set()
        for i in range(8):
            client, sport = f"10.0.1.{i + 1}", 40000 + i
            first = _syn_port(dp, client, sport)  # probe 0 of an empty backend
            rev_key = _key(dp._reverse, "10.3.0.41", NODE_IP, 8080, first)
            foreign = dp._reverse[rev_key]
            foreign.client = ip_to_map("10.0.9.9")  # another flow holds probe 0 now
            dp._reverse[rev_key] = foreign
            del dp._flows[_key(dp._flows, client, VIP, sport, 80)]
            second = _syn_port(dp, client, sport)  # a new connection: the next free probe
            assert second != first
            steps.add(second - first)
            del dp._reverse[rev_key]
            del dp._reverse[_key(dp._reverse, "10.3.0.41", NODE_IP, 8080, second)]
            del dp._flows[_key(dp._flows, client, VIP, sport, 80)]
        assert len(steps) >= 3, steps  # one shared step gives at most two (s and s - ports)
    finally:
        dp.delete_service(VIP, 80, "tcp")
