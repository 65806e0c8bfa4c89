"""Katran's balancer measured by scripts/bench-xdp's harness in the same run as Fabric's
program: the same packets, the same bench.c wrapper (restore the bytes, vary the flow,
tail-call the program), the same wrapper-around-XDP_PASS subtraction and the same
same-run baseline, with dataplane/bench/katran_shim.c in front to pop the IPIP header
each pass pushed (scripts/katran_anchor.py builds and configures Katran).
bench-xdp calls start(), then round() after each of its own rounds, then finish().

Every timed call checks Katran's own counters (every pass XDP_TX, and for new flows
every pass a SYN miss; no other miss) and the last pass's output (IPIP to a real of
the ring, the inner packet the one sent).
"""

from __future__ import annotations

import ctypes
import shutil
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import katran_anchor
from scapy.all import IP, TCP, Ether

from agent.dataplane.testrun import XDP_PASS, XDP_TX, run_xdp

SHIM = Path(__file__).resolve().parents[1] / "dataplane" / "bench" / "katran_shim.c"
GATEWAY_MAC = "02:00:00:00:fe:01"  # ctl_array[0]: the default router Katran sends every packet to
# the verdicts (Katran's counter deltas) each kind of timed call must show, per pass
FORWARD = ("tx", "total", "vip_packets")
NEW_FLOW = (*FORWARD, "lru_misses", "syn_misses")
NOT_VIP = ("pass", "total")


@dataclass(frozen=True)
class Harness:
    """What bench-xdp shares: its wrapper (xdp_bench), the bare XDP_PASS program, the
    wrap(prog_fd, packet, vary) that points the wrapper at a program, its packets."""
    wrapper_fd: int
    bare_fd: int
    wrap: Callable[[int, bytes, int], None]
    established: bytes      # VIP, ACK
    syn: bytes              # VIP, SYN
    other: bytes            # not a VIP
    backends: dict[str, int]
    repeat: int
    rounds: int
    working_set: int
    lru_per_cpu: int        # Fabric's per-CPU share of its flow table: Katran's per-CPU LRU size
    # fn(cpu) run at once on CPU 0 and CPU 1, results in CPU order (bench-xdp's on_both_cpus); None: skip
    both_cpus: Callable[[Callable[[int], Any]], list] | None = None


def inner_of(out: bytes, reals: set[str]) -> tuple[str, bytes]:
    """(real, inner IP packet) of Katran's output; fails unless it is IPIP to the gateway."""
    pkt = Ether(out)
    assert pkt[Ether].dst == GATEWAY_MAC and pkt[IP].proto == 4, pkt.summary()
    outer = pkt[IP]
    assert outer.dst in reals, f"{outer.dst} is not a real of the ring"
    header = IP(bytes(outer)[:20])
    sent_sum, header.chksum = header.chksum, None
    assert IP(bytes(header)).chksum == sent_sum, "outer IP checksum"
    return outer.dst, bytes(outer.payload)


def _fresh(ip: bytes) -> bytes:
    pkt = IP(ip)
    del pkt.chksum, pkt[TCP].chksum
    return bytes(IP(bytes(pkt)))


def start(h: Harness) -> KatranBench | str:
    """Katran built, loaded, configured and its table filled; or why it cannot be, here."""
    try:
        return KatranBench(h)
    except katran_anchor.KatranUnavailable as exc:
        return str(exc)


def finish(bench: KatranBench | str, baseline_ns: int) -> dict:
    """The JSON's "katran": figures against the same-run baseline, or {"unavailable": why}."""
    if isinstance(bench, str):
        return {"unavailable": bench}
    try:
        return bench.result(baseline_ns)
    finally:
        bench.close()


def figures(h: Harness, baseline_ns: int) -> dict:
    """start, h.rounds rounds, finish: Katran measured on its own (bench-xdp interleaves the rounds)."""
    bench = start(h)
    for _ in range(h.rounds if not isinstance(bench, str) else 0):
        bench.round()
    return finish(bench, baseline_ns)


def possible_cpus() -> int:
    return katran_anchor._lib().libbpf_num_possible_cpus()


def load_shim(wrapper_fd: int):
    """The shim (BCC) in front of bench.c's wrapper; returns (BPF object, shim fd)."""
    from bcc import BPF

    shim = BPF(src_file=str(SHIM))
    fn = shim.load_func("katran_shim", BPF.XDP)
    shim[b"shim_next"][ctypes.c_int(0)] = ctypes.c_int(wrapper_fd)
    return shim, fn.fd


class KatranBench:
    """Two builds loaded: `katran` (MAX_CONN_RATE lifted) and `stock` (as shipped, sharing
    katran's LRUs: the same full table). The caller runs pinned to one CPU: the LRU is per
    CPU and each case records its flows in one call and times them in the next."""

    def __init__(self, h: Harness):
        self.h = h
        self._work = Path(tempfile.mkdtemp(prefix="katran-"))
        self._loaded: list[katran_anchor.Katran] = []
        self._shim = None
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        h = self.h
        lifted = katran_anchor.build(self._work)
        stock = katran_anchor.build(self._work, defines=(), name="stock")
        self.katran = katran_anchor.Katran(lifted, h.lru_per_cpu)
        self._loaded.append(self.katran)
        self.stock = katran_anchor.Katran(stock, h.lru_per_cpu, lrus_of=self.katran)
        self._loaded.append(self.stock)
        self.ring = katran_anchor.maglev_ring(h.backends)
        self.reals = set(self.ring)
        for anchor in self._loaded:
            anchor.put_vip(Ether(h.established)[IP].dst, Ether(h.established)[TCP].dport, "tcp", self.ring,
                           GATEWAY_MAC)
        self._shim, self.shim_fd = load_shim(h.wrapper_fd)
        self.sent_ip = bytes(Ether(h.established)[IP])
        h.wrap(self.katran.prog_fd, h.established, 0)
        self.chosen, inner = inner_of(run_xdp(self.shim_fd, h.established).output, self.reals)
        assert inner == self.sent_ip, "Katran's inner packet differs from the one sent"
        h.wrap(self.katran.prog_fd, h.syn, 1)  # steady state: this CPU's LRU full before new flows are timed
        self._timed(self.shim_fd, h.syn, NEW_FLOW, repeat=2 * self.katran.lru_entries_per_cpu)
        self.rounds: dict[str, list[int]] = {k: [] for k in ("wfix", "est", "wvary", "new", "stock_new", "wcold",
                                                             "cold", "nonvip")}

    def _timed(self, fd: int, raw: bytes, counted: tuple[str, ...], repeat: int | None = None,
               anchor: katran_anchor.Katran | None = None) -> tuple[int, bytes]:
        """Run; every pass must show `counted` in the anchor's counters (nothing else); ns, last output."""
        anchor = anchor or self.katran
        repeat = repeat or self.h.repeat
        before = anchor.counters()
        result = run_xdp(fd, raw, repeat=repeat)
        after = anchor.counters()
        seen = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        assert seen == {k: repeat for k in counted}, seen
        want = XDP_TX if "tx" in counted else XDP_PASS
        assert result.retval == want, result.retval
        return result.duration_ns, result.output

    def round(self) -> None:
        """Each case timed once (the harness's order), checked pass by pass and on its last output."""
        h, k, timed, shim_fd, rounds = self.h, self.katran, self._timed, self.shim_fd, self.rounds
        h.wrap(h.bare_fd, h.established, 0)
        rounds["wfix"].append(timed(shim_fd, h.established, ())[0])
        h.wrap(k.prog_fd, h.established, 0)
        run_xdp(shim_fd, h.established)  # the last round's new flows evicted it: recorded again, untimed
        ns, out = timed(shim_fd, h.established, FORWARD)
        assert inner_of(out, self.reals) == (self.chosen, self.sent_ip), "established flow moved to another real"
        rounds["est"].append(ns)

        wrapper_ns, ns = self.new_flow()
        rounds["wvary"].append(wrapper_ns)
        rounds["new"].append(ns)
        h.wrap(self.stock.prog_fd, h.syn, 1)  # stock: past 125000 new flows/s per CPU it records none
        ns, out = timed(shim_fd, h.syn, NEW_FLOW, anchor=self.stock)
        inner_of(out, self.reals)
        rounds["stock_new"].append(ns)

        h.wrap(k.prog_fd, h.syn, 2)  # cold: record a working set, then cycle through it
        timed(shim_fd, h.syn, NEW_FLOW, repeat=h.working_set)
        h.wrap(h.bare_fd, h.established, 2)
        rounds["wcold"].append(timed(shim_fd, h.established, ())[0])
        h.wrap(k.prog_fd, h.established, 2)
        ns, out = timed(shim_fd, h.established, FORWARD)
        inner_of(out, self.reals)
        rounds["cold"].append(ns)

        ns, out = timed(k.prog_fd, h.other, NOT_VIP)  # passed untouched: repeat is sound unwrapped
        assert out == h.other
        rounds["nonvip"].append(ns)

    def new_flow(self) -> tuple[int, int]:
        """One new-flow measurement (round()'s, and each of bench-xdp's dsr pairs): wrapper ns with
        the same rotation around XDP_PASS, new-flow ns; every pass checked, the last output too."""
        h = self.h
        h.wrap(h.bare_fd, h.established, 1)
        wrapper_ns = self._timed(self.shim_fd, h.established, ())[0]
        h.wrap(self.katran.prog_fd, h.syn, 1)
        ns, out = self._timed(self.shim_fd, h.syn, NEW_FLOW)  # every pass a distinct flow
        _, inner = inner_of(out, self.reals)
        assert IP(inner).src != "10.0.0.2" and inner == _fresh(inner), "new-flow inner packet"
        return wrapper_ns, ns

    def result(self, base: int) -> dict:
        """Medians of the rounds, each case's wrapper cost replaced by the same-run baseline."""
        both = _two_cpus(self.h, self.katran, self.shim_fd, base) if self.h.both_cpus else None
        med = {k: int(statistics.median(v)) for k, v in self.rounds.items()}
        ns = {"vip_established": med["est"] - med["wfix"] + base,
              "vip_established_cold": med["cold"] - med["wcold"] + base,
              "vip_new_flow": med["new"] - med["wvary"] + base,
              "vip_new_flow_stock": med["stock_new"] - med["wvary"] + base,
              "non_vip": med["nonvip"]}
        out: dict = {f"{k}_ns": v for k, v in ns.items()}
        out.update({f"{k}_ratio": round(v / base, 2) for k, v in ns.items()})
        out.update({
            "baseline_pass_ns": base,
            "rounds": len(self.rounds["est"]),
            "wrapper_overhead_ns": med["wfix"] - base,  # shim + bench.c around XDP_PASS, subtracted above
            "wrapper_vary_overhead_ns": med["wvary"] - base,
            "lru_entries_per_cpu": self.katran.lru_entries_per_cpu,
            "source": katran_anchor.upstream(),
            "build": "clang -O2 -emit-llvm | llc -march=bpf (katran/lib/Makefile-bpf), MAX_CONN_RATE lifted "
                     "so every new flow is recorded, as Fabric records every one",
            "both_cpus": both,
            "vip_new_flow_stock": "the stock build (MAX_CONN_RATE 125000) on the same full table: past 125000 "
                                  "new flows per second per CPU it stops recording them (a SYN flood guard), "
                                  "so most of a timed run's SYNs skip the LRU insert",
            "config": f"one TCP VIP, {len(self.reals)} reals, Maglev ring of {katran_anchor.RING_SIZE} "
                      f"(Fabric's builder), one LRU per CPU, default gateway MAC in ctl_array",
            "verdict": "XDP_TX: IPIP to the real, Ethernet to the gateway (Fabric: DNAT, fib lookup, redirect)",
        })
        return out

    def close(self) -> None:
        if self._shim is not None:
            self._shim.cleanup()
            self._shim = None
        for anchor in reversed(self._loaded):
            anchor.close()
        self._loaded = []
        shutil.rmtree(self._work, ignore_errors=True)


def _two_cpus(h: Harness, katran: katran_anchor.Katran, shim_fd: int, baseline_ns: int) -> dict:
    """bench-xdp's two_cpu_figures for Katran: established cold and new flow, both CPUs loaded
    at once (each CPU its own flows and its own LRU), every pass's verdict checked in aggregate."""
    ack, syn, run = h.established, h.syn, h.both_cpus
    figures: dict[str, list[int]] = {"est_cold": [], "new": []}
    for _ in range(h.rounds):
        h.wrap(katran.prog_fd, syn, 2)
        before = katran.counters()
        run(lambda cpu: run_xdp(shim_fd, syn, repeat=h.working_set))
        h.wrap(h.bare_fd, ack, 2)
        wrapper_ns = run(lambda cpu: run_xdp(shim_fd, ack, repeat=h.repeat).duration_ns)
        h.wrap(katran.prog_fd, ack, 2)
        est = run(lambda cpu: run_xdp(shim_fd, ack, repeat=h.repeat).duration_ns)
        h.wrap(h.bare_fd, syn, 1)
        wrapper_vary_ns = run(lambda cpu: run_xdp(shim_fd, syn, repeat=h.repeat).duration_ns)
        h.wrap(katran.prog_fd, syn, 1)
        new = run(lambda cpu: run_xdp(shim_fd, syn, repeat=h.repeat).duration_ns)
        after = katran.counters()
        seen = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        forwarded, created = 2 * (h.working_set + 2 * h.repeat), 2 * (h.working_set + h.repeat)
        assert seen == {**{k: forwarded for k in FORWARD}, "lru_misses": created, "syn_misses": created}, seen
        for cpu in (0, 1):
            figures["est_cold"].append(est[cpu] - wrapper_ns[cpu] + baseline_ns)
            figures["new"].append(new[cpu] - wrapper_vary_ns[cpu] + baseline_ns)
    med = {k: int(statistics.median(v)) for k, v in figures.items()}
    return {"vip_established_cold_ns": med["est_cold"],
            "vip_established_cold_ratio": round(med["est_cold"] / baseline_ns, 2),
            "vip_new_flow_ns": med["new"], "vip_new_flow_ratio": round(med["new"] / baseline_ns, 2)}


def compare(ours: dict, katran: dict) -> dict:
    """Fabric's ratio over Katran's per case: below 1 means Fabric is cheaper."""
    if "unavailable" in katran:
        return {}
    keys = ("vip_established_ratio", "vip_established_cold_ratio", "vip_new_flow_ratio", "non_vip_ratio")
    out = {k.removesuffix("_ratio"): round(ours[k] / katran[k], 2) for k in keys}
    out["vip_new_flow_vs_stock"] = round(ours["vip_new_flow_ratio"] / katran["vip_new_flow_stock_ratio"], 2)
    if "dsr" in ours:  # Fabric's dsr-ipip mode does Katran's work (IPIP, no reverse entry)
        for k in ("vip_established_cold_ratio", "vip_new_flow_ratio"):
            out["dsr_" + k.removesuffix("_ratio")] = round(ours["dsr"][k] / katran[k], 2)
    if katran.get("both_cpus") and "percpu_lru" in ours.get("both_cpus", {}):
        mine, theirs = ours["both_cpus"]["percpu_lru"], katran["both_cpus"]
        for k in ("vip_established_cold_ratio", "vip_new_flow_ratio"):
            out["both_cpus_" + k.removesuffix("_ratio")] = round(mine[k] / theirs[k], 2)
    return out
