"""The test_run harness that scripts/bench-xdp times every program through: its
packet, dataplane/bpf/bench.c loaded with BCC (its xdp_bench wrapper and a bare XDP_PASS
program), wrap() pointing the wrapper at a program and a packet, and on_both_cpus()
loading CPU 0 and CPU 1 at once, and load_ipip_pop() for programs that push an IPIP header.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

from scapy.all import IP, TCP, Ether, Raw

from agent.dataplane.loader import BPF_DIR

# the repository's dataplane/bench (BPF_DIR is the package's dataplane/bpf link, with no bench/ beside it)
IPIP_POP = Path(__file__).resolve().parents[1] / "dataplane" / "bench" / "ipip_pop.c"

BENCH_LEN = 64  # bench.c restores this many bytes before each pass


def packet(dst: str, src: str = "10.0.0.2", sport: int = 40000, flags: str = "A", dport: int = 80) -> bytes:
    """The benchmark's packet: Ethernet/IPv4/TCP with 10 bytes of payload, BENCH_LEN bytes."""
    raw = bytes(Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02") / IP(src=src, dst=dst)
                / TCP(sport=sport, dport=dport, flags=flags) / Raw(b"0123456789"))
    assert len(raw) == BENCH_LEN
    return raw


class BenchWrapper:
    """bench.c loaded: `wrapper` (xdp_bench) and `bare` (xdp_pass) are BCC functions (.fd)."""

    def __init__(self):
        from bcc import BPF

        self.bpf = BPF(src_file=str(BPF_DIR / "bench.c"))
        self.wrapper = self.bpf.load_func("xdp_bench", BPF.XDP)
        self.bare = self.bpf.load_func("xdp_pass", BPF.XDP)
        self._target, self._inputs = self.bpf[b"bench_target"], self.bpf[b"bench_input"]

    def wrap(self, prog_fd: int, raw: bytes, vary: int) -> None:
        """The wrapper's next runs: restore `raw` before each pass (vary: bench.c), then run prog_fd."""
        self._target[ctypes.c_int(0)] = ctypes.c_int(prog_fd)
        entry = self._inputs.Leaf()
        ctypes.memmove(entry.bytes, raw, len(raw))
        entry.vary = vary
        self._inputs[ctypes.c_int(0)] = entry

    def close(self) -> None:
        self.bpf.cleanup()


def load_ipip_pop(wrapper_fd: int):
    """dataplane/bench/ipip_pop.c (BCC) in front of bench.c's wrapper: pops the outer header
    each dsr-ipip pass pushed. Returns (BPF object, fd to run)."""
    from bcc import BPF

    pop = BPF(src_file=str(IPIP_POP))
    fn = pop.load_func("ipip_pop", BPF.XDP)
    pop[b"shim_next"][ctypes.c_int(0)] = ctypes.c_int(wrapper_fd)
    return pop, fn.fd


def enter_netns(ns: str) -> None:
    from agent.dataplane.netns import _setns

    _setns(f"/var/run/netns/{ns}")


def on_both_cpus(fn, netns: str | None = None) -> list:
    """fn(cpu) run at once on CPU 0 and CPU 1 (threads pinned; test_run holds no GIL): results in CPU order."""
    out: list = [None, None]
    errors: list = []
    start = threading.Barrier(2)

    def body(cpu: int) -> None:
        try:
            os.sched_setaffinity(0, {cpu})
            if netns:
                enter_netns(netns)
            start.wait()
            out[cpu] = fn(cpu)
        except BaseException as exc:  # noqa: BLE001  re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(cpu,)) for cpu in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out
