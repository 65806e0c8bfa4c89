"""Forwarding in BPF (docs/dataplane.md "Forwarding"): after translation the
fib lookup picks the egress and the frame leaves by XDP_REDIRECT / XDP_TX with
its MACs and TTL rewritten; what only the stack can do (unresolved neighbour,
a frame over the egress MTU, TTL expiry, a bridge port the FDB does not name)
goes up with XDP_PASS, translated. dsr-ipip services are encapsulated instead
of translated. The TC reply program redirects replies of local backends.

Packet tables through BPF_PROG_TEST_RUN run inside a namespace this module
makes, whose routes, neighbours and bridge FDB are fixed:

    ni  10.0.0.1/24  (ingress; client 10.0.0.2 and backend 10.0.0.50 known on it)
    nb  10.1.0.1/24  mtu 1400; 10.1.0.11 known, 10.1.0.12 unknown
    br0 10.3.0.1/24  port vp; 10.3.0.11 known with an FDB entry on vp, 10.3.0.12 known without one
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from scapy.all import IP, TCP, Ether, Raw

from agent.dataplane.netns import run_in_netns
from agent.dataplane.testrun import XDP_PASS, XDP_REDIRECT, XDP_TX, run_xdp
from agent.settings import DataplaneSettings
from lab.rigs.bpf import new_pin_dir, open_dataplane
from lab.rigs.polling import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_dataplane_packets import _valid

VIP = "10.9.0.100"
CLIENT = "10.0.0.2"
CLIENT_MAC = "02:00:00:00:00:02"
MACS = {"10.1.0.11": "02:00:00:00:01:11", "10.3.0.11": "02:00:00:00:03:11", "10.3.0.12": "02:00:00:00:03:12",
        "10.0.0.50": "02:00:00:00:00:50"}
L2 = Ether(dst="02:00:00:00:00:01", src=CLIENT_MAC)
BACKEND_L2 = Ether(dst="02:00:00:00:00:01", src="02:00:00:00:01:11")
TC_ACT_OK, TC_ACT_REDIRECT = 0, 7
# port -> backend (one service each, so every case knows where it goes)
SERVICES = {80: "10.1.0.11:8080", 81: "10.1.0.12:8080", 82: "10.3.0.11:8080", 83: "10.3.0.12:8080",
            84: "10.0.0.50:8080"}
DSR_PORT, DSR_BACKEND = 85, "10.1.0.11:85"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)


@dataclass
class Net:
    ns: str
    peer: str
    links: dict[str, tuple[int, str]]  # name -> (ifindex, MAC)


def _build(ns: str, peer: str) -> Net:
    sh("ip", "netns", "add", ns)
    sh("ip", "netns", "add", peer)
    n = ["ip", "-n", ns]
    sh(*n, "link", "set", "lo", "up")
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
    for name, addr, mtu in (("ni", "10.0.0.1/24", "1500"), ("nb", "10.1.0.1/24", "1400"), ("vp", None, "1500")):
        sh("ip", "link", "add", name, "netns", ns, "mtu", mtu, "type", "veth", "peer", "name", f"p{name}",
           "netns", peer)
        if addr:
            sh(*n, "addr", "add", addr, "dev", name)
        sh(*n, "link", "set", name, "up")
    sh(*n, "link", "add", "br0", "type", "bridge")
    sh(*n, "link", "set", "vp", "master", "br0")
    sh(*n, "addr", "add", "10.3.0.1/24", "dev", "br0")
    sh(*n, "link", "set", "br0", "up")
    for ip, dev in ((CLIENT, "ni"), ("10.0.0.50", "ni"), ("10.1.0.11", "nb"), ("10.3.0.11", "br0"),
                    ("10.3.0.12", "br0")):
        sh(*n, "neigh", "replace", ip, "lladdr", MACS.get(ip, CLIENT_MAC), "dev", dev, "nud", "permanent")
    sh("bridge", "-n", ns, "fdb", "replace", MACS["10.3.0.11"], "dev", "vp", "master", "static")

    def links():
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            return {m.get_attr("IFLA_IFNAME"): (m["index"], m.get_attr("IFLA_ADDRESS")) for m in ipr.get_links()}

    return Net(ns=ns, peer=peer, links=run_in_netns(ns, links))


@pytest.fixture(scope="module")
def net(require_bpf):
    suffix = uuid.uuid4().hex[:6]
    ns, peer = f"fabf-{suffix}", f"fabfp-{suffix}"
    try:
        yield _build(ns, peer)
    finally:
        for name in (ns, peer):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def plane(net):
    pin_dir = new_pin_dir()
    dp = open_dataplane(pin_dir, route_netns=net.ns)
    dp.configure(settings=DataplaneSettings(xdp_forward=True))
    for port, backend in SERVICES.items():
        dp.put_service(VIP, port, "tcp", {backend: 1})  # each put refreshes egress_devs and bridge_ports
    dp.put_service(VIP, DSR_PORT, "tcp", {DSR_BACKEND: 1}, forwarding="dsr-ipip")
    yield dp
    dp.close()
    shutil.rmtree(pin_dir, ignore_errors=True)


def _on_one_cpu(call):
    """Run ``call`` on one fixed CPU: the forwarding cache is per CPU, so two test_runs that the
    scheduler placed on different CPUs would each start with their own (empty) cache."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    return call()


def _xdp(net: Net, dp, raw: bytes):
    before = dp.xmit_counters()
    result = run_in_netns(net.ns, lambda: _on_one_cpu(
        lambda: run_xdp(dp.xdp_fd, raw, ingress_ifindex=net.links["ni"][0])))
    after = dp.xmit_counters()
    return result, {k: after[k] - before[k] for k in after if after[k] != before[k]}


def _expected(sent, backend: str, dmac: str | None, smac: str | None, ttl_drop: int):
    ip, port = backend.split(":")
    out = sent.copy()
    out[IP].dst = ip
    out[TCP].dport = int(port)
    out[IP].ttl -= ttl_drop
    if dmac:
        out[Ether].dst, out[Ether].src = dmac, smac
    del out[IP].chksum, out[TCP].chksum
    return bytes(Ether(bytes(out)))


@dataclass(frozen=True)
class Case:
    desc: str
    port: int
    action: int
    xmit: str
    egress: str | None  # the device whose MAC becomes the source; None: MACs untouched
    ttl: int = 64
    size: int = 10


CASES = [
    Case("resolved neighbour on another device: redirect, MACs and TTL rewritten", 80, XDP_REDIRECT, "redirect", "nb"),
    Case("route without a resolved neighbour: the stack resolves it", 81, XDP_PASS, "no_neigh", None),
    Case("behind a bridge, FDB names the port: redirect to the port", 82, XDP_REDIRECT, "redirect", "br0"),
    Case("behind a bridge, MAC in no FDB entry: the stack bridges it", 83, XDP_PASS, "unknown_dev", None),
    Case("egress is the ingress device: XDP_TX", 84, XDP_TX, "tx", "ni"),
    Case("TTL 1: the stack sends time exceeded", 80, XDP_PASS, "ttl", None, ttl=1),
    Case("over the egress MTU (1400): the stack fragments or answers", 80, XDP_PASS, "frag_needed", None, size=1400),
]


@pytest.mark.parametrize("case", CASES, ids=[c.desc for c in CASES])
def test_translated_packets_leave_by_the_fib(net, plane, case):
    sent = L2 / IP(src=CLIENT, dst=VIP, ttl=case.ttl) / TCP(sport=40000 + case.port, dport=case.port, flags="S") \
        / Raw(b"x" * case.size)
    result, xmit = _xdp(net, plane, bytes(sent))
    assert (result.retval, xmit) == (case.action, {case.xmit: 1})
    backend = SERVICES[case.port]
    dmac = MACS[backend.split(":")[0]] if case.egress else None
    smac = net.links[case.egress][1] if case.egress else None
    assert result.output == _expected(sent, backend, dmac, smac, 1 if case.egress else 0)
    assert _valid(result.output)


def test_dsr_service_is_encapsulated_not_translated(net, plane):
    inner = IP(src=CLIENT, dst=VIP) / TCP(sport=41000, dport=DSR_PORT, flags="S") / Raw(b"hello")
    result, xmit = _xdp(net, plane, bytes(L2 / inner))
    assert (result.retval, xmit) == (XDP_REDIRECT, {"redirect": 1})
    out = Ether(result.output)
    assert (out.dst, out.src) == (MACS["10.1.0.11"], net.links["nb"][1])
    assert (out[IP].proto, out[IP].src, out[IP].dst, out[IP].ttl) == (4, CLIENT, "10.1.0.11", 63)
    assert bytes(out[IP].payload) == bytes(inner)  # the client's packet, untouched
    assert _valid(result.output)
    # established: the same flow is encapsulated to the same backend without a reverse entry
    again, _ = _xdp(net, plane, bytes(L2 / IP(src=CLIENT, dst=VIP) / TCP(sport=41000, dport=DSR_PORT, flags="A")))
    assert again.retval == XDP_REDIRECT and Ether(again.output)[IP].dst == "10.1.0.11"
    assert plane.verdict_counters()["fwd_established"] >= 1


def test_dsr_refuses_a_backend_port_other_than_the_vips(plane):
    from common.errors import InvalidInput

    with pytest.raises(InvalidInput, match="must be 86"):
        plane.put_service(VIP, 86, "tcp", {"10.1.0.11:8080": 1}, forwarding="dsr-ipip")
    with pytest.raises(InvalidInput, match="forwarding must be one of"):
        plane.put_service(VIP, 86, "tcp", {"10.1.0.11:86": 1}, forwarding="dsr")


def test_reply_of_a_local_backend_is_translated_and_redirected_by_tc(net, plane):
    # the flow exists (a SYN recorded it); its reply arrives on the bridge side
    sent = L2 / IP(src=CLIENT, dst=VIP) / TCP(sport=42000, dport=80, flags="S")
    assert _xdp(net, plane, bytes(sent))[0].retval == XDP_REDIRECT
    reply = BACKEND_L2 / IP(src="10.1.0.11", dst=CLIENT, ttl=64) / TCP(sport=8080, dport=42000, flags="SA") / Raw(b"r")
    before = plane.xmit_counters()
    result = run_in_netns(net.ns, lambda: run_xdp(plane._prog.tc_reply.fd, bytes(reply)))
    assert result.retval == TC_ACT_REDIRECT
    assert plane.xmit_counters()["redirect"] == before["redirect"] + 1
    out = Ether(result.output)
    assert (out.dst, out.src) == (CLIENT_MAC, net.links["ni"][1])
    assert (out[IP].src, out[TCP].sport, out[IP].ttl) == (VIP, 80, 63)
    assert _valid(result.output)
    # no flow: untouched, for the stack (and the egress program) as before
    stranger = bytes(BACKEND_L2 / IP(src="10.1.0.11", dst=CLIENT) / TCP(sport=8080, dport=42999, flags="A"))
    result = run_in_netns(net.ns, lambda: run_xdp(plane._prog.tc_reply.fd, stranger))
    assert (result.retval, result.output) == (TC_ACT_OK, stranger)


def test_forwarding_off_hands_translated_packets_to_the_stack(net, plane):
    plane.configure(settings=DataplaneSettings(xdp_forward=False))
    try:
        sent = L2 / IP(src=CLIENT, dst=VIP) / TCP(sport=43000, dport=80, flags="S")
        result, xmit = _xdp(net, plane, bytes(sent))
        assert (result.retval, xmit) == (XDP_PASS, {"stack": 1})
        assert result.output == _expected(sent, SERVICES[80], None, None, 0)
    finally:
        plane.configure(settings=DataplaneSettings(xdp_forward=True))


# -- the per-CPU forwarding cache (fib_cache, fib_gen) ---------------------------------------------

CACHE_PORT, CACHE_BACKEND = 87, "10.1.0.11:8087"  # a backend no other test sends to: its cache starts empty


def _cache_packet(sport: int, size: int = 10) -> bytes:
    return bytes(L2 / IP(src=CLIENT, dst=VIP) / TCP(sport=sport, dport=CACHE_PORT, flags="S") / Raw(b"x" * size))


def _set_backend_mac(net: Net, mac: str) -> None:
    sh("ip", "-n", net.ns, "neigh", "replace", "10.1.0.11", "lladdr", mac, "dev", "nb", "nud", "permanent")


def test_established_packets_reuse_the_backends_fib_result_until_the_generation_moves(net, plane):
    plane.put_service(VIP, CACHE_PORT, "tcp", {CACHE_BACKEND: 1})  # refreshes the device maps: a new generation
    moved = "02:00:00:00:01:99"
    try:
        rows = [  # (what, packet, xmit counted, destination MAC of the output)
            ("first packet: fib lookup, result cached", _cache_packet(47001), {"redirect": 1}, MACS["10.1.0.11"]),
            ("same backend, another flow: from the cache", _cache_packet(47002), {"redirect": 1, "fib_cached": 1},
             MACS["10.1.0.11"]),
            ("longer than any cached packet: the fib checks the MTU", _cache_packet(47003, size=1400),
             {"frag_needed": 1}, None),
            ("neighbour changed, generation not bumped: still the cached MAC", _cache_packet(47004),
             {"redirect": 1, "fib_cached": 1}, MACS["10.1.0.11"]),
            ("generation bumped: a fresh fib result", _cache_packet(47005), {"redirect": 1}, moved),
            ("and that one is cached in turn", _cache_packet(47006), {"redirect": 1, "fib_cached": 1}, moved),
        ]
        for what, raw, want_xmit, dmac in rows:
            if what.startswith("neighbour changed"):
                _set_backend_mac(net, moved)
            if what.startswith("generation bumped"):
                plane.bump_fib_gen()
            result, xmit = _xdp(net, plane, raw)
            assert xmit == want_xmit, what
            if dmac is None:
                assert result.retval == XDP_PASS, what
                continue
            assert result.retval == XDP_REDIRECT, what
            assert result.output == _expected(Ether(raw), CACHE_BACKEND, dmac, net.links["nb"][1], 1), what
            assert _valid(result.output), what
    finally:
        _set_backend_mac(net, MACS["10.1.0.11"])
        plane.bump_fib_gen()


def test_fib_watch_bumps_the_generation_on_a_neighbour_change(net, plane):
    """What attach starts: a neighbour change in the namespace reaches the program without a put."""

    from agent.dataplane.fibwatch import FibWatch

    plane.put_service(VIP, CACHE_PORT, "tcp", {CACHE_BACKEND: 1})
    calls: list[bool] = []

    def changed(devices: bool) -> None:
        calls.append(devices)
        plane._routing_changed(devices)

    watch = FibWatch(net.ns, changed, period_s=600)  # no time bound inside this test: only events
    watch.start()
    moved = "02:00:00:00:01:98"
    try:
        _xdp(net, plane, _cache_packet(47101))
        assert _xdp(net, plane, _cache_packet(47102))[1] == {"redirect": 1, "fib_cached": 1}
        _set_backend_mac(net, moved)
        wait_for(lambda: calls, 10, "the FIB watch to see the neighbour message", interval=0.05)
        assert calls[0] is False  # a neighbour message: the cache, not the device maps
        result, xmit = _xdp(net, plane, _cache_packet(47103))
        assert (xmit, Ether(result.output).dst) == ({"redirect": 1}, moved)
        calls.clear()
        sh("bridge", "-n", net.ns, "fdb", "replace", "02:00:00:00:03:77", "dev", "vp", "master", "static")
        # an FDB message re-reads them
        wait_for(lambda: any(calls), 10, "a device-map re-read after the FDB change", interval=0.05)
    finally:
        watch.stop()
        sh("bridge", "-n", net.ns, "fdb", "del", "02:00:00:00:03:77", "dev", "vp", "master")
        _set_backend_mac(net, MACS["10.1.0.11"])
        plane.bump_fib_gen()
