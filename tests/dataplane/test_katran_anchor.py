"""Katran, the benchmark's anchor (scripts/katran_anchor.py, scripts/bench_xdp_katran.py):
built from the vendored sources, loaded and configured for one VIP, it forwards a VIP
packet (XDP_TX, IPIP to a real of the ring, the packet sent inside) and passes anything
else untouched; and the benchmark's measured path (shim -> bench.c wrapper -> Katran)
runs every pass with those verdicts. So bench-xdp's Katran timings time a working balancer.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from scapy.all import IP, Ether

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_xdp_katran
import katran_anchor
from xdp_bench_wrapper import BenchWrapper, on_both_cpus, packet

from agent.dataplane.testrun import XDP_PASS, XDP_TX, run_xdp

VIP = "10.9.0.100"
BACKENDS = {f"10.1.0.{i}:8080": 1 + i % 3 for i in range(1, 11)}
WORKING_SET = 65536  # bench.c


@pytest.fixture(scope="module")
def one_cpu():
    """The LRU is per CPU: a flow recorded by one run_xdp is found by the next on the same CPU."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    yield
    os.sched_setaffinity(0, cpus)


@pytest.fixture(scope="module")
def katran(require_bpf, one_cpu):
    work = tempfile.mkdtemp(prefix="katran-test-")
    anchor = katran_anchor.Katran(katran_anchor.build(Path(work)), 4096)
    ring = katran_anchor.maglev_ring(BACKENDS)
    anchor.put_vip(VIP, 80, "tcp", ring, bench_xdp_katran.GATEWAY_MAC)
    yield anchor, set(ring)
    anchor.close()
    shutil.rmtree(work, ignore_errors=True)


def test_the_vendored_sources_are_pinned_and_licensed():
    assert katran_anchor.upstream() == "facebookincubator/katran@19f08fec82fb7b5fb14d935a80057bdc0897c8de"
    assert "GNU GENERAL PUBLIC LICENSE" in (katran_anchor.SOURCES / "LICENSE").read_text()


def test_a_vip_packet_leaves_ipip_encapsulated_to_a_real_of_the_ring(katran):
    anchor, reals = katran
    before = anchor.counters()
    for sport in range(40000, 40032):
        sent = packet(VIP, sport=sport, flags="S")
        result = run_xdp(anchor.prog_fd, sent)
        assert result.retval == XDP_TX
        real, inner = bench_xdp_katran.inner_of(result.output, reals)
        assert inner == bytes(Ether(sent)[IP])
        # the flow is recorded: its next packet goes to the same real
        again = run_xdp(anchor.prog_fd, packet(VIP, sport=sport)).output
        assert bench_xdp_katran.inner_of(again, reals)[0] == real
    after = anchor.counters()
    assert after["tx"] - before["tx"] == 64 and after["syn_misses"] - before["syn_misses"] == 32
    assert after["non_syn_misses"] == before["non_syn_misses"]


@pytest.mark.parametrize("sent", [packet("10.5.5.5"), packet(VIP, dport=81)], ids=["other-ip", "other-port"])
def test_anything_else_passes_untouched(katran, sent):
    anchor, _ = katran
    result = run_xdp(anchor.prog_fd, sent)
    assert (result.retval, result.output) == (XDP_PASS, sent)


def test_the_benchmark_path_forwards_every_pass(require_bpf, one_cpu):
    """figures() with a small repeat: its own per-call checks (Katran's counters, the last
    output) are the assertions; a broken shim, wrapper or configuration fails them."""
    harness = BenchWrapper()
    baseline = run_xdp(harness.bare.fd, packet(VIP), repeat=1000).duration_ns
    out = bench_xdp_katran.figures(bench_xdp_katran.Harness(
        harness.wrapper.fd, harness.bare.fd, harness.wrap,
        packet(VIP), packet(VIP, flags="S"), packet("10.5.5.5"), BACKENDS, repeat=2000, rounds=1, working_set=WORKING_SET, lru_per_cpu=4 * WORKING_SET,
        both_cpus=on_both_cpus), max(1, baseline))
    harness.close()
    assert "unavailable" not in out, out
    assert out["lru_entries_per_cpu"] == 4 * WORKING_SET
    for case in ("vip_established", "vip_established_cold", "vip_new_flow", "vip_new_flow_stock", "non_vip"):
        assert out[f"{case}_ns"] > 0 and out[f"{case}_ratio"] > 0, (case, out)
    assert out["both_cpus"]["vip_established_cold_ns"] > 0 and out["both_cpus"]["vip_new_flow_ns"] > 0


def test_the_benchmark_says_exactly_why_katran_is_unavailable(monkeypatch):
    """No clang on the PATH: figures() reports the reason instead of figures (bench-xdp's JSON)."""
    monkeypatch.setattr(katran_anchor.shutil, "which", lambda tool: None if tool == "clang" else "/usr/bin/" + tool)
    out = bench_xdp_katran.figures(None, 1)  # the build fails before the harness is touched
    assert out == {"unavailable": "clang not found (Debian packages clang, llvm)"}


def test_the_comparison_puts_fabrics_dsr_mode_beside_katran_on_katrans_work():
    """fabric_over_katran: each Fabric ratio over Katran's, the dsr-ipip ones (one flow
    entry, IPIP: Katran's work) against the same Katran figures as the NAT ones."""
    ours = {"vip_established_ratio": 12.0, "vip_established_cold_ratio": 60.0, "vip_new_flow_ratio": 300.0,
            "non_vip_ratio": 2.0, "dsr": {"vip_established_cold_ratio": 45.0, "vip_new_flow_ratio": 120.0}}
    katran = {"vip_established_ratio": 12.0, "vip_established_cold_ratio": 40.0, "vip_new_flow_ratio": 150.0,
              "non_vip_ratio": 4.0, "vip_new_flow_stock_ratio": 100.0}
    out = bench_xdp_katran.compare(ours, katran)
    assert out == {"vip_established": 1.0, "vip_established_cold": 1.5, "vip_new_flow": 2.0, "non_vip": 0.5,
                   "vip_new_flow_vs_stock": 3.0, "dsr_vip_established_cold": 1.12, "dsr_vip_new_flow": 0.8}
    assert bench_xdp_katran.compare(ours, {"unavailable": "no clang"}) == {}
