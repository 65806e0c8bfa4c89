"""Two balancer nodes announcing VIPs over BGP to a router that spreads flows by ECMP
(`fabric-lab ecmp up --gpu-hosts 1`, lab/ecmp.py): the router's table holds each VIP with a next
hop per balancer, new flows reach both balancers, a GPU host without the balancer role gets no
service and announces nothing while its replica serves through the balancers, a node whose service has no ready backend withdraws its
route, an endpoint deleted on both withdraws it from both, an agent killed with SIGKILL loses its
route at once (its BIRD dies with it) while established dsr-ipip streams keep their backend through
the other node, and a node that goes silent loses its route at the hold timer. The lab is built
once (about 25 s) through the real console script and torn down through it, leaving nothing.

Names live under fabric-ecmp-* (not the single-node lab's), so this holds its own lock."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from lab import ecmp
from lab.ecmp import DSR_VIP, NAT_VIP, EcmpConfig
from lab.processes import alive
from lab.rigs.lab_lock import lab_unavailable
from lab.rigs.polling import wait_for
from lab.topology_ecmp import EcmpTopology

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(lab_unavailable() is not None, reason=lab_unavailable() or "")]

BIN = Path(sys.executable).parent
HOLD = 3
# Waits are bounds on a behaviour (a route that never goes fails the test), not timings: the
# withdrawals happen within a second (session closed) or at the hold timer; restoring a
# session takes BIRD's error-wait and connect-retry (1-4 s) on a loaded machine.
WITHDRAW_BOUND = HOLD + 5
RESTORE_BOUND = 40


def fabricd(state: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "fabric-lab"), "ecmp", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    state = tmp_path_factory.mktemp("ecmp")
    config = EcmpConfig(state_dir=state, topology=EcmpTopology(replicas_per_node=1, gpu_hosts=1), hold_secs=HOLD)
    with open("/tmp/fabric-ecmp-lab.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            up = fabricd(state, "up", "--replicas", "1", "--gpu-hosts", "1", "--hold-secs", str(HOLD))
            assert up.returncode == 0, up.stdout + up.stderr
            yield config
        finally:
            down = fabricd(state, "down")
            fcntl.flock(lock, fcntl.LOCK_UN)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "nothing left behind" in down.stdout
    assert ecmp.status(config) == []


GPU_HOST = 3  # node 3: no balancer role
REPLICAS = {"n1r1", "n2r1", "n3r1"}  # one per node; n3r1 behind the GPU host


def both(cfg):
    return ecmp.node_hops(cfg)


def test_router_holds_each_vip_with_a_next_hop_per_node(cfg):
    for vip in (DSR_VIP, NAT_VIP):
        assert ecmp.next_hops(cfg, vip) == both(cfg)
    for n in (1, 2):
        status = wait_for(lambda n=n: (s := ecmp.bgp_status(cfg, n))["peers"][0]["established"] and s, 10,
                          f"node {n}'s announcer to see its session up")  # it reads BIRD once a second
        assert status["announced"] == [DSR_VIP, NAT_VIP]
    route = subprocess.run(["ip", "-n", cfg.topology.router_ns, "route", "show", f"{DSR_VIP}/32"],
                           capture_output=True, text=True, timeout=10).stdout
    assert "proto bird" in route and route.count("nexthop via") == 2


def test_new_flows_reach_both_nodes_and_every_one_succeeds(cfg):
    for vip in (DSR_VIP, NAT_VIP):
        before = [ecmp.node_packets(cfg, n, vip) for n in (1, 2)]
        answers = Counter(ecmp.one_request(cfg, vip, timeout=3) for _ in range(40))
        after = [ecmp.node_packets(cfg, n, vip) for n in (1, 2)]
        assert None not in answers, answers
        assert set(answers) == REPLICAS, answers
        assert all(a > b for a, b in zip(after, before)), (vip, before, after)  # both nodes balanced flows


def test_a_gpu_host_without_the_role_gets_no_services_and_serves_through_the_balancers(cfg):
    # fabricd's push code, given the three nodes as their records say, sends to the balancers only
    assert ecmp.put_services(cfg) == ["ecmp-n1", "ecmp-n2"]
    assert ecmp.held_services(cfg, GPU_HOST) == []
    for n in (1, 2):
        assert ecmp.held_services(cfg, n) == [DSR_VIP, NAT_VIP]
    for vip in (DSR_VIP, NAT_VIP):
        assert ecmp.next_hops(cfg, vip) == both(cfg)  # announced by the balancers, never the GPU host
        answers = Counter(ecmp.one_request(cfg, vip, timeout=3) for _ in range(30))
        assert None not in answers and "n3r1" in answers, (vip, answers)  # its replica, through a balancer
        assert ecmp.node_packets(cfg, GPU_HOST, vip) == 0  # its own XDP program balanced nothing


def test_a_node_without_a_ready_backend_does_not_announce(cfg):
    drained = {b: 0 for b in cfg.backends()}  # every backend at weight 0 on node 2 only
    ecmp.put_services(cfg, nodes=[2], backends=drained)
    try:
        ecmp.wait_next_hops(cfg, DSR_VIP, ecmp.node_hops(cfg, [1]), WITHDRAW_BOUND)
        ecmp.wait_next_hops(cfg, NAT_VIP, ecmp.node_hops(cfg, [1]), WITHDRAW_BOUND)
        reasons = ecmp.bgp_status(cfg, 2)["reasons"]
        assert reasons[DSR_VIP].startswith("withdrawn: no ready backend")
        assert all(ecmp.one_request(cfg, DSR_VIP, timeout=3) for _ in range(10))
    finally:
        ecmp.put_services(cfg, nodes=[2])
    ecmp.wait_next_hops(cfg, DSR_VIP, both(cfg), RESTORE_BOUND)


def test_endpoint_delete_withdraws_the_vip_from_both_nodes(cfg):
    ecmp.delete_service(cfg, NAT_VIP)
    try:
        ecmp.wait_next_hops(cfg, NAT_VIP, [], WITHDRAW_BOUND)
        assert ecmp.next_hops(cfg, DSR_VIP) == both(cfg)  # the other VIP stays
        for n in (1, 2):  # the status follows BIRD's reload in the same pass: polled, bounded
            wait_for(lambda n=n: ecmp.bgp_status(cfg, n)["announced"] == [DSR_VIP], WITHDRAW_BOUND,
                     f"node {n}'s status to name only {DSR_VIP}")
            assert ecmp.bgp_status(cfg, n)["announced"] == [DSR_VIP]
    finally:
        ecmp.put_services(cfg)
    ecmp.wait_next_hops(cfg, NAT_VIP, both(cfg), RESTORE_BOUND)


def test_sigkill_of_an_agent_withdraws_and_dsr_streams_keep_their_backend(cfg):
    streams = [ecmp.client_socket(cfg, DSR_VIP, timeout=3) for _ in range(12)]
    try:
        first = [ecmp.ask(s, "one") for s in streams]
        ecmp.kill_agent(cfg, 1)
        ecmp.wait_next_hops(cfg, DSR_VIP, ecmp.node_hops(cfg, [2]), WITHDRAW_BOUND)
        ecmp.wait_next_hops(cfg, NAT_VIP, ecmp.node_hops(cfg, [2]), WITHDRAW_BOUND)
        new = [ecmp.one_request(cfg, DSR_VIP, timeout=3) for _ in range(30)]
        assert None not in new and set(new) == REPLICAS, new  # every new flow, every backend
        kept = [ecmp.ask(s, "two") for s in streams]  # raises on a broken stream
        assert kept == first
    finally:
        for s in streams:
            s.close()
        ecmp.start_agent(cfg, 1)
        ecmp.wait_agent(cfg, 1)
    ecmp.wait_next_hops(cfg, DSR_VIP, both(cfg), RESTORE_BOUND)  # the restarted agent announces again


def test_a_silent_node_loses_its_route_at_the_hold_timer(cfg):
    seen = len(ecmp.bgp_status(cfg, 2)["events"])
    ecmp.silence_node(cfg, 2)
    try:
        ecmp.wait_next_hops(cfg, DSR_VIP, ecmp.node_hops(cfg, [1]), WITHDRAW_BOUND)
        answers = [ecmp.one_request(cfg, DSR_VIP, timeout=3) for _ in range(10)]
        assert None not in answers, answers

        def node_timed_out() -> list[str] | None:
            events = [e["message"] for e in ecmp.bgp_status(cfg, 2)["events"]][seen:]
            return events if any("Hold timer expired" in m for m in events) else None

        # Node 2 hears nothing either, so its own hold timer ends its side of the session. Both
        # timers start at the same silence; the router's can fire first, and a restore before
        # node 2's fires would let the router's reset end it instead ("Connection reset by
        # peer"), so the check waits for node 2 while the silence lasts.
        wait_for(node_timed_out, WITHDRAW_BOUND, "node 2 to see its session's hold timer expire")
    finally:
        ecmp.restore_node(cfg, 2)
    ecmp.wait_next_hops(cfg, DSR_VIP, both(cfg), RESTORE_BOUND)


def test_a_clean_agent_stop_withdraws_before_it_exits(cfg):
    pid = ecmp.agent_pid(cfg, 2)
    os.kill(pid, signal.SIGTERM)
    try:
        ecmp.wait_next_hops(cfg, DSR_VIP, ecmp.node_hops(cfg, [1]), WITHDRAW_BOUND)
        wait_for(lambda: not alive(pid), 20, "the agent to exit after SIGTERM")
        log = (cfg.state_dir / "logs" / "agent-n2.log").read_text()
        assert "agent stopping: every VIP withdrawn" in log
    finally:
        ecmp.start_agent(cfg, 2)
        ecmp.wait_agent(cfg, 2)
    ecmp.wait_next_hops(cfg, DSR_VIP, both(cfg), RESTORE_BOUND)
