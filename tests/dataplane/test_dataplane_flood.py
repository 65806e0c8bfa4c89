"""Real connections through the XDP program while a bounded flood of spoofed flows
hits the VIP from the client namespace (random sources and ports, each flow seen
twice: SYN, then ACK): held connections (some with responses that pause while the
client says nothing, one source-NATed to a routed backend) stay healthy, new ones
keep working and balancing, ping to the VIP answers, and path-MTU discovery works
through the VIP when the backend side has the smaller MTU. Everything happens in
namespaces this module makes."""

from __future__ import annotations

import os
import random
import shutil
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataplane_nslab import ROUTED_BACKEND, VIP, NsLab, agent_lab, http_get, read_response

from agent.dataplane.netns import run_in_netns
from lab.rigs.syn_scan import checksum as _csum

WEIGHTS = {"10.1.0.11:8080": 1, "10.1.0.12:8080": 2, "10.1.0.13:8080": 4}
NAMES = {"b1", "b2", "b3"}
FLOOD_FLOWS = 20000  # each sent twice; the lab's flow tables hold 65536 entries each
FLOOD_SECS = 20  # the flood stops after this long whatever it has sent
PAUSE_SECS = 3
# The veth that carries the flood hands frames to the node's XDP program through a ring of 256;
# on a busy machine an unpaced sender fills it faster than the node's softirq (or ksoftirqd, which
# competes with every other process) drains it, and the surplus is dropped before the program sees
# it. A short sleep every 128 frames lets the receiver run: still ~40,000 frames in about a second.
PACE_EVERY = 128
PACE_SECS = 0.0005


@pytest.fixture(scope="module")
def lab(require_bpf):
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip")
    with agent_lab() as lab:
        yield lab


def _spoofed(src: bytes, sport: int, flags: int, dst_mac: bytes, src_mac: bytes) -> bytes:
    dst = socket.inet_aton(VIP)
    tcp = struct.pack("!HHIIBBHHH", sport, 80, 1, 0 if flags == 0x02 else 1, 5 << 4, flags, 64240, 0, 0)
    check = _csum(src + dst + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)
    tcp = tcp[:16] + struct.pack("!H", check) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", _csum(ip)) + ip[12:]
    return dst_mac + src_mac + b"\x08\x00" + ip + tcp


def _mac(iface: str) -> bytes:
    """The device's MAC in the calling thread's namespace (sysfs would show the host's)."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        link = ipr.link("get", index=ipr.link_lookup(ifname=iface)[0])[0]
        return bytes.fromhex(link.get_attr("IFLA_ADDRESS").replace(":", ""))


def _flood(lab: NsLab, flows: int, secs: float) -> int:
    """From the client namespace's eth0: `flows` spoofed flows (198.18.0.0/15 sources,
    random ports), each a SYN then an ACK. Returns the packets sent."""

    def body() -> int:
        src_mac = _mac("eth0")
        dst_mac = run_in_netns(lab.node, lambda: _mac("ni"))
        rng = random.Random(10)
        spoofed = [(struct.pack("!I", (198 << 24) | (18 << 16) | rng.randrange(1 << 17)), rng.randrange(1024, 65535))
                   for _ in range(flows)]
        sent, deadline = 0, time.monotonic() + secs
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind(("eth0", 0))
            for flags in (0x02, 0x10):  # SYN for every flow, then ACK for every flow
                for src, sport in spoofed:
                    if time.monotonic() > deadline:
                        return sent
                    s.send(_spoofed(src, sport, flags, dst_mac, src_mac))
                    sent += 1
                    if sent % PACE_EVERY == 0:
                        time.sleep(PACE_SECS)
        return sent

    return run_in_netns(lab.client, body)


def _start_paused(sock: socket.socket) -> None:
    sock.sendall(f"GET /pause/{PAUSE_SECS} HTTP/1.1\r\nHost: vip\r\n\r\n".encode())


def _ping(lab: NsLab, count: int = 3) -> int:
    """Echo requests to the VIP from the client namespace; replies received."""

    def body() -> int:
        got = 0
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as s:
            s.settimeout(2)
            for seq in range(count):
                ident = os.getpid() & 0xFFFF
                head = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
                payload = b"fabric-ping"
                head = struct.pack("!BBHHH", 8, 0, _csum(head + payload), ident, seq)
                s.sendto(head + payload, (VIP, 0))
                try:
                    while True:
                        data, addr = s.recvfrom(2048)
                        icmp = data[(data[0] & 0xF) * 4:]
                        if addr[0] == VIP and icmp[0] == 0 and struct.unpack("!HH", icmp[4:8]) == (ident, seq):
                            got += 1
                            break
                except TimeoutError:
                    pass
        return got

    return run_in_netns(lab.client, body)


def test_held_connections_survive_a_flood_and_new_ones_keep_balancing(lab):
    assert lab.agent.call("put", 80, WEIGHTS) in (True, False)
    assert lab.agent.call("put", 81, {ROUTED_BACKEND: 1}) in (True, False)
    held = [lab.connect(80) for _ in range(6)]
    snat = lab.connect(81)
    try:
        names = [http_get(s) for s in held]
        assert http_get(snat) == "r"
        paused = held[:3] + [snat]
        for s in paused:  # their responses stall while the client stays silent
            _start_paused(s)
        before = lab.agent.call("verdicts")
        result: dict[str, int] = {}
        flood = threading.Thread(target=lambda: result.update(sent=_flood(lab, FLOOD_FLOWS, FLOOD_SECS)))
        flood.start()
        flood.join(timeout=FLOOD_SECS + 30)
        assert not flood.is_alive()
        after = lab.agent.call("verdicts")
        assert result["sent"] > FLOOD_FLOWS  # every SYN and some ACKs at least
        entered = after["fwd_new_flow"] - before["fwd_new_flow"]
        assert entered >= FLOOD_FLOWS // 2, f"{entered} new flows reached the program of {result['sent']} frames"

        for s, name in zip(held[:3], names[:3]):  # the paused responses complete
            s.settimeout(PAUSE_SECS + 10)
            assert read_response(s) == f"{name}|{name}"
        snat.settimeout(PAUSE_SECS + 10)
        assert read_response(snat) == "r|r"
        for s, name in zip(held, names):  # and every held connection still talks to its backend
            assert http_get(s) == name
        assert http_get(snat) == "r"

        fresh = lab.names(140, first_source_port=21000)
        assert set(fresh) == NAMES
        assert fresh.count("b3") > fresh.count("b1")  # weights 1:2:4 still show
        assert _ping(lab) == 3
    finally:
        for s in held + [snat]:
            s.close()


def test_path_mtu_discovery_through_the_vip(lab):
    backend = lab.add_small_mtu_backend(1200)
    assert lab.agent.call("put", 83, {backend: 1}) is True
    size = 400_000

    def upload() -> str:
        with socket.create_connection((VIP, 83), timeout=15) as s:
            s.sendall(f"POST /upload HTTP/1.1\r\nHost: vip\r\nContent-Length: {size}\r\n\r\n".encode())
            s.sendall(os.urandom(size))
            return read_response(s)

    before = lab.agent.call("verdicts")
    assert run_in_netns(lab.client, upload) == str(size)
    # the node's "fragmentation needed" reached the client in the VIP's terms
    assert lab.agent.call("verdicts")["reply_icmp_error"] > before["reply_icmp_error"]
