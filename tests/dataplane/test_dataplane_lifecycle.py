"""Connection lifecycle and NAT state through BPF_PROG_TEST_RUN (packet-table
style, helpers from test_dataplane_packets.py): SYN picks from the current table,
RST/FIN never create entries, non-SYN misses are recorded under the per-CPU insert
budget, UDP entries expire, removed backends' flows are picked again while
draining ones are kept, and the NAT survives losing either of its two entries."""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from scapy.all import IP, TCP, UDP, Ether, Raw

from agent.dataplane.addresses import ip_to_map, port_to_map
from agent.dataplane.flowtable import monotonic_ns
from agent.dataplane.testrun import XDP_DROP, XDP_PASS, run_xdp
from agent.settings import DataplaneSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_dataplane_packets import L2, TC_ACT_OK, _backend_of, _dnat, _run, _valid

CLIENT = "10.0.0.2"
VIP = "10.9.7.1"
A, B = "10.1.0.11:8080", "10.1.0.12:8080"
NODE_IP = "10.2.0.1"
SNAT_VIP = "10.9.7.2"
ROUTED = "10.3.0.5:8080"  # no bridge route on this host: source-NATed


@pytest.fixture
def dp(plain_plane):
    return plain_plane


@pytest.fixture
def sdp(snat_plane):
    return snat_plane


@contextmanager
def one_cpu():
    """The insert budget is per CPU: keep every test run on one."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _tcp(sport: int, flags: str, dst: str = VIP, payload: bytes = b""):
    pkt = L2 / IP(src=CLIENT, dst=dst) / TCP(sport=sport, dport=80, flags=flags)
    return pkt / Raw(payload) if payload else pkt


def _key(table, src: str, dst: str, sport: int, dport: int, proto: int = 6):
    key = table.Key()
    key.src, key.dst = ip_to_map(src), ip_to_map(dst)
    key.sport, key.dport, key.proto = port_to_map(sport), port_to_map(dport), proto
    return key


def _flow(dp, sport: int, dst: str = VIP, proto: int = 6):
    return dp._flows.get(_key(dp._flows, CLIENT, dst, sport, 80 if proto == 6 else 53, proto))


def _send(dp, pkt, verdict: str, backend: str | None = None, action: int = XDP_PASS):
    result, changed = _run(dp, bytes(pkt))
    assert (result.retval, changed) == (action, {verdict: 1}), changed
    if backend is not None:
        assert result.output == _dnat(pkt, backend) and _valid(result.output)
    return result


def _reply(backend: str, sport: int, vip: str = VIP):
    ip, port = backend.split(":")
    return Ether() / IP(src=ip, dst=CLIENT) / TCP(sport=int(port), dport=sport, flags="A") / Raw(b"r")


def _restored(dp, backend: str, sport: int, vip: str = VIP) -> None:
    reply = _reply(backend, sport)
    out = run_xdp(dp._prog.tc.fd, bytes(reply))
    assert out.retval == TC_ACT_OK
    want = reply.copy()
    want[IP].src, want[TCP].sport = vip, 80
    del want[IP].chksum, want[TCP].chksum
    assert out.output == bytes(Ether(bytes(want))) and _valid(out.output)


def _untouched(dp, backend: str, sport: int) -> None:
    reply = _reply(backend, sport)
    out = run_xdp(dp._prog.tc.fd, bytes(reply))
    assert out.retval == TC_ACT_OK and out.output == bytes(reply)


def _sport_on(dp, backend: str, first: int) -> int:
    """A client port whose SYN the current table sends to `backend` (recorded)."""
    for sport in range(first, first + 200):
        result, _ = _run(dp, bytes(_tcp(sport, "S")))
        if _backend_of(result.output) == backend:
            return sport
    raise AssertionError(f"no port in {first}.. maps to {backend}")


def test_syn_picks_from_the_current_table_and_replaces_a_stale_entry(dp):
    dp.put_service(VIP, 80, "tcp", {A: 1, B: 1})
    sport = _sport_on(dp, A, 30000)
    _send(dp, _tcp(sport, "A", payload=b"x"), "fwd_established", A)
    dp.put_service(VIP, 80, "tcp", {A: 0, B: 1})  # A keeps its flows, takes no new ones
    _send(dp, _tcp(sport, "A", payload=b"x"), "fwd_established", A)
    _send(dp, _tcp(sport, "S"), "fwd_new_flow", B)  # the tuple is reused: a new connection
    _send(dp, _tcp(sport, "A", payload=b"x"), "fwd_established", B)


@pytest.mark.parametrize("flags", ["R", "RA", "FA"])
def test_rst_and_fin_misses_are_forwarded_but_never_recorded(dp, flags):
    dp.put_service(VIP, 80, "tcp", {A: 1})
    sport = 31000 + len(flags)
    _send(dp, _tcp(sport, flags), "fwd_untracked", A)
    assert _flow(dp, sport) is None
    _untouched(dp, A, sport)  # no flow: its reply is not translated


def test_non_syn_miss_is_recorded_within_the_insert_budget_and_counted(dp):
    dp.put_service(VIP, 80, "tcp", {A: 1})
    before = dp.get_service(VIP, 80, "tcp").misses
    dp.configure(settings=DataplaneSettings(miss_inserts=3))
    try:
        with one_cpu():
            outcomes = [_run(dp, bytes(_tcp(32000 + i, "A", payload=b"x")))[1] for i in range(5)]
    finally:
        dp.configure(settings=DataplaneSettings())
    recorded = [i for i, c in enumerate(outcomes) if c == {"fwd_miss_recorded": 1}]
    untracked = [i for i, c in enumerate(outcomes) if c == {"fwd_untracked": 1}]
    # the window may roll over once during the run: at most 3 per second
    assert len(recorded) >= 3 and len(recorded) + len(untracked) == 5, outcomes
    for i in recorded:
        assert _flow(dp, 32000 + i) is not None
        _restored(dp, A, 32000 + i)
        _send(dp, _tcp(32000 + i, "A", payload=b"y"), "fwd_established", A)
    for i in untracked:
        assert _flow(dp, 32000 + i) is None
        _untouched(dp, A, 32000 + i)
    after = dp.get_service(VIP, 80, "tcp").misses
    assert after.other - before.other == 5 and after.syn == before.syn


def test_udp_flow_expires_after_its_silence_and_is_picked_again(dp):
    dp.put_service(VIP, 53, "udp", {"10.1.0.21:5353": 1})
    pkt = L2 / IP(src=CLIENT, dst=VIP) / UDP(sport=33000, dport=53) / Raw(b"q")
    _send(dp, pkt, "fwd_new_flow", "10.1.0.21:5353")
    _send(dp, pkt, "fwd_established", "10.1.0.21:5353")
    key = _key(dp._flows, CLIENT, VIP, 33000, 53, 17)
    entry = dp._flows[key]
    entry.last_seen = monotonic_ns() - 29 * 10**9
    dp._flows[key] = entry
    _send(dp, pkt, "fwd_established", "10.1.0.21:5353")  # 29 s of silence: still the flow
    entry = dp._flows[key]
    entry.last_seen = monotonic_ns() - 31 * 10**9
    dp._flows[key] = entry
    _send(dp, pkt, "fwd_repicked", "10.1.0.21:5353")  # 31 s (FABRIC_UDP_FLOW_SECS=30): picked again
    assert dp._flows[key].last_seen > monotonic_ns() - 10**9


def test_removed_backend_flows_are_repicked_draining_ones_kept_and_counted(dp):
    dp.put_service(VIP, 80, "tcp", {A: 1, B: 1})
    on_a = _sport_on(dp, A, 34000)
    on_b = _sport_on(dp, B, 34300)
    closing = _sport_on(dp, B, 34600)
    _send(dp, _tcp(closing, "FA"), "fwd_established", B)  # the client ends it
    view = {b.address: b for b in dp.get_service(VIP, 80, "tcp").backends}
    assert view[B].active_flows >= 1 and view[A].active_flows >= 1

    dp.put_service(VIP, 80, "tcp", {A: 1, B: 1}, draining=[B])
    _send(dp, _tcp(on_b, "A", payload=b"x"), "fwd_established", B)
    view = {b.address: b for b in dp.get_service(VIP, 80, "tcp").backends}
    assert view[B].draining and view[B].slots == 0
    active_b = view[B].active_flows
    _send(dp, _tcp(on_b, "FA"), "fwd_established", B)
    assert {b.address: b for b in dp.get_service(VIP, 80, "tcp").backends}[B].active_flows == active_b - 1

    dp.put_service(VIP, 80, "tcp", {B: 1})  # A removed: its flows go where the table says
    _send(dp, _tcp(on_a, "A", payload=b"x"), "fwd_repicked", B)
    _send(dp, _tcp(on_a, "A", payload=b"x"), "fwd_established", B)


def test_a_pick_that_meets_a_draining_backend_moves_on(dp):
    """The ring switch follows the backend writes: a ring that still lists a
    backend already marked draining must not give it new flows."""
    dp.put_service(VIP, 80, "tcp", {A: 1, B: 1})
    bid = dp._service_state(dp._read_services()[next(a for a in dp._read_services() if a.vip == VIP and
                                                       a.port == 80)], dp._read_backends()).backend_ids[A]
    entry = dp._backends[ctypes.c_uint32(bid)]
    entry.flags |= 2  # BACKEND_DRAINING, the ring untouched
    dp._backends[ctypes.c_uint32(bid)] = entry
    try:
        picks = {_backend_of(_run(dp, bytes(_tcp(sport, "S")))[0].output) for sport in range(34900, 34940)}
        assert picks == {B}
    finally:
        entry.flags &= ~2
        dp._backends[ctypes.c_uint32(bid)] = entry


def test_a_nat_flow_is_one_entry_and_its_reply_is_found_by_its_addresses(dp):
    """A nat flow records its forward entry only: a reply (backend -> client) is
    translated while the client's flow to the VIP names that backend, and goes
    untouched otherwise (the backend's answer to another client or to a probe)."""
    dp.put_service(VIP, 80, "tcp", {A: 1, B: 1})
    before = sum(1 for _ in dp._reverse.items())
    sport = _sport_on(dp, A, 35300)
    assert sum(1 for _ in dp._reverse.items()) == before  # no reverse entry
    _restored(dp, A, sport)
    _untouched(dp, B, sport)  # the other backend: this client's flow is not its
    _untouched(dp, A, sport + 1)  # a port of this client without a flow
    probe = Ether() / IP(src=A.split(":")[0], dst="10.2.0.9") / TCP(sport=8080, dport=sport, flags="A")
    assert run_xdp(dp._prog.tc.fd, bytes(probe)).output == bytes(probe)


def test_evicted_forward_entry_is_recorded_again_and_its_replies_follow(dp):
    """An evicted entry costs its replies' translation until the client's next
    packet records the flow again (the table picks the same backend)."""
    dp.put_service(VIP, 80, "tcp", {A: 1, B: 1})
    sport = _sport_on(dp, B, 35000)
    del dp._flows[_key(dp._flows, CLIENT, VIP, sport, 80)]
    _untouched(dp, B, sport)
    _send(dp, _tcp(sport, "A", payload=b"x"), "fwd_miss_recorded", B)
    _restored(dp, B, sport)
    _send(dp, _tcp(sport, "A", payload=b"x"), "fwd_established", B)


def _gen(dp) -> int:
    return dp._fib_gen[ctypes.c_uint32(0)].value


# -- source NAT ------------------------------------------------------------------

def _snat_syn(dp, sport: int):
    result = _send(dp, _tcp(sport, "S", dst=SNAT_VIP), "fwd_new_flow")
    out = Ether(result.output)
    assert (out[IP].src, out[IP].dst, out[TCP].dport) == (NODE_IP, "10.3.0.5", 8080) and _valid(result.output)
    return out[TCP].sport


def _snat_ack(dp, sport: int, verdict: str) -> int:
    result = _send(dp, _tcp(sport, "A", dst=SNAT_VIP, payload=b"x"), verdict)
    out = Ether(result.output)
    assert (out[IP].src, out[IP].dst) == (NODE_IP, "10.3.0.5") and _valid(result.output)
    return out[TCP].sport


def _snat_reply_ok(dp, snat_port: int, sport: int) -> None:
    reply = L2 / IP(src="10.3.0.5", dst=NODE_IP) / TCP(sport=8080, dport=snat_port, flags="A") / Raw(b"r")
    result, changed = _run(dp, bytes(reply))
    assert changed == {"reply_snat": 1}
    back = Ether(result.output)
    assert (back[IP].src, back[TCP].sport, back[IP].dst, back[TCP].dport) == (SNAT_VIP, 80, CLIENT, sport)
    assert _valid(result.output)


def _snat_key(dp, port: int):
    return _key(dp._reverse, "10.3.0.5", NODE_IP, 8080, port)


def test_snat_port_survives_either_entry_being_evicted(sdp):
    dp = sdp
    dp.put_service(SNAT_VIP, 80, "tcp", {ROUTED: 1})
    sport = 36000
    port = _snat_syn(dp, sport)
    rev = dp._reverse[_snat_key(dp, port)]
    assert (rev.snat, rev.cport) == (1, port_to_map(sport))  # it records its flow
    # forward entry lost, reverse kept: the flow finds its own port again
    del dp._flows[_key(dp._flows, CLIENT, SNAT_VIP, sport, 80)]
    assert _snat_ack(dp, sport, "fwd_miss_recorded") == port
    _snat_reply_ok(dp, port, sport)
    # reverse entry lost, forward kept: claimed again at the same port once the generation moved
    del dp._reverse[_snat_key(dp, port)]
    dp.bump_fib_gen()
    assert _snat_ack(dp, sport, "fwd_established") == port
    _snat_reply_ok(dp, port, sport)
    # both lost: the port is a function of the flow, the same one comes back
    del dp._flows[_key(dp._flows, CLIENT, SNAT_VIP, sport, 80)]
    del dp._reverse[_snat_key(dp, port)]
    assert _snat_syn(dp, sport) == port


def test_snat_reverse_entry_is_checked_once_per_generation_and_on_every_fin_or_rst(sdp):
    """An established source-NAT packet checks its reverse entry once per fib
    generation: an entry evicted within the generation that recorded the flow
    stays missing, the first forward packet after the agent's bump (at least
    every second) writes it again; a FIN or RST checks it at once, and so does
    every packet while the generation is 0 (cache off)."""
    dp = sdp
    dp.put_service(SNAT_VIP, 80, "tcp", {ROUTED: 1})
    sport = 36050
    port = _snat_syn(dp, sport)
    gen = _gen(dp)
    assert _flow(dp, sport, dst=SNAT_VIP).rev_gen == gen & 0xFFFF  # written under this generation
    del dp._reverse[_snat_key(dp, port)]
    assert _snat_ack(dp, sport, "fwd_established") == port
    assert dp._reverse.get(_snat_key(dp, port)) is None  # same generation: not looked up again
    dp.bump_fib_gen()
    assert _snat_ack(dp, sport, "fwd_established") == port
    _snat_reply_ok(dp, port, sport)
    assert _flow(dp, sport, dst=SNAT_VIP).rev_gen == (gen + 1) & 0xFFFF
    del dp._reverse[_snat_key(dp, port)]
    result = _send(dp, _tcp(sport, "FA", dst=SNAT_VIP), "fwd_established")  # never waits for a bump
    assert Ether(result.output)[TCP].sport == port
    _snat_reply_ok(dp, port, sport)
    key = ctypes.c_uint32(0)
    held = dp._fib_gen[key]
    dp._fib_gen[key] = ctypes.c_uint32(0)
    try:
        for _ in range(2):
            del dp._reverse[_snat_key(dp, port)]
            assert _snat_ack(dp, sport, "fwd_established") == port
            _snat_reply_ok(dp, port, sport)
    finally:
        dp._fib_gen[key] = held


def test_snat_port_held_by_another_flow_is_never_shared(sdp):
    dp = sdp
    dp.put_service(SNAT_VIP, 80, "tcp", {ROUTED: 1})
    sport = 36100
    port = _snat_syn(dp, sport)
    # another flow takes this flow's port after both its entries were lost
    del dp._flows[_key(dp._flows, CLIENT, SNAT_VIP, sport, 80)]
    other = dp._reverse[_snat_key(dp, port)]
    other.client = ip_to_map("10.0.0.99")
    dp._reverse[_snat_key(dp, port)] = other
    new_port = _snat_syn(dp, sport)
    assert new_port != port
    assert dp._reverse[_snat_key(dp, port)].client == ip_to_map("10.0.0.99")  # untouched
    _snat_reply_ok(dp, new_port, sport)
    # an established flow whose port was taken meanwhile moves to a port of its own (next generation)
    dp._reverse[_snat_key(dp, new_port)] = other
    assert _snat_ack(dp, sport, "fwd_established") == new_port  # within the generation: not re-checked
    dp.bump_fib_gen()
    moved = _snat_ack(dp, sport, "fwd_established")
    assert moved not in (port, new_port)
    assert dp._reverse[_snat_key(dp, new_port)].client == ip_to_map("10.0.0.99")
    _snat_reply_ok(dp, moved, sport)


def test_snat_syn_claims_the_first_free_port_a_lost_flow_keeps_its_own(sdp):
    """A non-SYN packet that lost its forward entry finds its own surviving reverse entry
    (the backend sees the same connection); a SYN starts a new one and claims the first
    free port of its probe sequence without searching."""
    dp = sdp
    dp.put_service(SNAT_VIP, 80, "tcp", {ROUTED: 1})
    sport = 36300
    first = _snat_syn(dp, sport)  # probe 0 of an empty table
    other = dp._reverse[_snat_key(dp, first)]
    other.client = ip_to_map("10.0.0.98")
    dp._reverse[_snat_key(dp, first)] = other  # another flow holds probe 0
    del dp._flows[_key(dp._flows, CLIENT, SNAT_VIP, sport, 80)]
    later = _snat_ack(dp, sport, "fwd_miss_recorded")  # claims the next probe: its own from now on
    assert later != first
    del dp._reverse[_snat_key(dp, first)]  # probe 0 free again
    del dp._flows[_key(dp._flows, CLIENT, SNAT_VIP, sport, 80)]
    assert _snat_ack(dp, sport, "fwd_miss_recorded") == later  # found, not claimed
    del dp._flows[_key(dp._flows, CLIENT, SNAT_VIP, sport, 80)]
    assert _snat_syn(dp, sport) == first  # a new connection: the first free probe
    _snat_reply_ok(dp, first, sport)


def test_snat_rst_without_its_reverse_entry_is_dropped_not_recorded(sdp):
    dp = sdp
    dp.put_service(SNAT_VIP, 80, "tcp", {ROUTED: 1})
    _send(dp, _tcp(36200, "R", dst=SNAT_VIP), "drop_untracked_snat", action=XDP_DROP)
    assert _flow(dp, 36200, dst=SNAT_VIP) is None


def _backend_ids(dp, vip: str) -> dict[str, int]:
    services = dp._read_services()
    svc = services[next(a for a in services if a.vip == vip)]
    return dp._service_state(svc, dp._read_backends()).backend_ids


def test_reused_backend_and_service_ids_start_with_zero_counters(dp):
    vip, again = "10.9.7.9", "10.9.7.10"
    dp.put_service(vip, 80, "tcp", {"10.1.0.91:8080": 1})
    for sport in range(37000, 37005):
        _run(dp, bytes(_tcp(sport, "S", dst=vip)))
    view = dp.get_service(vip, 80, "tcp")
    assert view.backends[0].packets == 5 and view.misses.syn == 5
    bid = _backend_ids(dp, vip)["10.1.0.91:8080"]
    assert dp.delete_service(vip, 80, "tcp")
    dp.put_service(again, 80, "tcp", {"10.1.0.93:8080": 1})  # lowest free ids: the ones just freed
    try:
        assert _backend_ids(dp, again)["10.1.0.93:8080"] == bid
        view = dp.get_service(again, 80, "tcp")
        assert view.backends[0].packets == 0 and view.misses.syn == 0
    finally:
        dp.delete_service(again, 80, "tcp")
