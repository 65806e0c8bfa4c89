"""A flood of spoofed flows steered to one CPU (as an attacker who picks the tuples one receive
queue hashes to can) leaves that CPU's established flows translated: every CPU's LRU list holds
the whole flow table (loader.Layout.map_entries), so a flood must exceed the table, not a CPU's
share of it. Checked with BPF_PROG_TEST_RUN on CPU 0 only, against the layout that split the
table over the CPUs, where the same flood evicts the established flows."""

from __future__ import annotations

import os
import shutil
import socket
import struct

import pytest

from agent.dataplane.loader import possible_cpus
from agent.dataplane.testrun import run_xdp
from lab.rigs.bpf import new_pin_dir, open_dataplane
from lab.rigs.syn_scan import checksum

VIP = "10.96.7.1"
CLIENT = "10.200.0.2"
TABLE = 4096  # entries each CPU's list holds
LEGIT = 200
FLOOD = int(TABLE * 0.75)  # more than a CPU's share of a split table, less than a whole one
BACKENDS = {f"10.1.0.{i}:8080": 1 for i in range(1, 11)}
MACS = b"\x02\x00\x00\x00\x00\x01" + b"\x02\x00\x00\x00\x00\x02"


def tcp(src: str, dst: str, sport: int, dport: int, flags: int) -> bytes:
    s, d = socket.inet_aton(src), socket.inet_aton(dst)
    hdr = struct.pack("!HHIIBBHHH", sport, dport, 1, 0 if flags == 0x02 else 1, 5 << 4, flags, 64240, 0, 0)
    hdr = hdr[:16] + struct.pack("!H", checksum(s + d + struct.pack("!BBH", 0, 6, len(hdr)) + hdr)) + hdr[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(hdr), 0, 0x4000, 64, 6, 0, s, d)
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    return MACS + b"\x08\x00" + ip + hdr


def dst_of(frame: bytes) -> tuple[str, int]:
    return socket.inet_ntoa(frame[30:34]), struct.unpack("!H", frame[36:38])[0]


def src_of(frame: bytes) -> str:
    return socket.inet_ntoa(frame[26:30])


def survivors(**layout) -> float:
    pin_dir = new_pin_dir()
    dp = open_dataplane(pin_dir, flow_entries=TABLE, **layout)
    try:
        dp.put_service(VIP, 80, "tcp", BACKENDS)
        legit = {}
        for i in range(LEGIT):
            out = run_xdp(dp.xdp_fd, tcp(CLIENT, VIP, 20000 + i, 80, 0x02)).output
            legit[20000 + i] = dst_of(out)
        for flags in (0x02, 0x10):  # SYN, then ACK: the same spoofed flows twice
            for j in range(FLOOD):
                src = f"172.{16 + j // 65536}.{(j // 256) % 256}.{j % 256}"
                run_xdp(dp.xdp_fd, tcp(src, VIP, 1024 + j % 60000, 80, flags))
        alive = 0
        for sport, (ip, port) in legit.items():
            reply = run_xdp(dp._prog.tc.fd, tcp(ip, CLIENT, port, sport, 0x10)).output
            if src_of(reply) != VIP:
                continue  # the reply's translation was evicted
            alive += dst_of(run_xdp(dp.xdp_fd, tcp(CLIENT, VIP, sport, 80, 0x10)).output) == (ip, port)
        return alive / LEGIT
    finally:
        dp.close()
        shutil.rmtree(pin_dir, ignore_errors=True)


@pytest.fixture
def on_cpu0():
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    yield
    os.sched_setaffinity(0, before)


def test_a_flood_on_one_cpu_leaves_that_cpus_established_flows_translated(require_bpf, on_cpu0):
    assert survivors() == 1.0


def test_the_split_layout_loses_them_to_the_same_flood(require_bpf, on_cpu0):
    split = survivors(percpu_full=False)
    if possible_cpus() == 1:  # one CPU: split and full are the same layout
        assert split == 1.0
    else:
        assert split < 0.5  # the flood exceeds CPU 0's share of a split table
