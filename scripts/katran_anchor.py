"""Katran's XDP balancer as a benchmark anchor: built from the pinned sources in
dataplane/bench/katran with clang | llc (Katran's own recipe, katran/lib/Makefile-bpf),
loaded with libbpf.so.1 (ctypes) and configured the way Katran's userspace
(KatranLb) does for one VIP: vip_map, reals (ids from 1), the VIP's Maglev ring in
ch_rings, the default gateway's MAC in ctl_array[0], and one LRU per possible CPU
in the lru_mapping map-in-map. Nothing here is part of Fabric's dataplane.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "dataplane" / "bench" / "katran"
PROGRAM = "balancer_ingress"
RING_SIZE = 65537          # balancer_consts.h
MAX_VIPS = 512
# stats map indices (balancer_consts.h): counters at MAX_VIPS + index
LRU_CNTRS, LRU_MISS_CNTR, NEW_CONN_RATE_CNTR = 0, 1, 2
XDP_TOTAL_CNTR, XDP_TX_CNTR, XDP_DROP_CNTR, XDP_PASS_CNTR = 16, 17, 18, 19
BPF_MAP_TYPE_LRU_HASH = 9
IPPROTO = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}
# Katran stops recording new flows past MAX_CONN_RATE new flows per second per CPU
# (125000 by default). A benchmark sends a million SYNs in well under a second, so
# with the stock value most timed SYNs would skip the LRU insert; lifted, every new
# flow is recorded, as Fabric's program records every one.
LIFTED_CONN_RATE = "-DMAX_CONN_RATE=0xffffffffffffffffULL"


class KatranUnavailable(RuntimeError):
    """Katran could not be built or loaded here; the message says exactly why."""


def build(out_dir: Path, defines: tuple[str, ...] = (LIFTED_CONN_RATE,), name: str = "balancer.bpf") -> Path:
    """out_dir/name.o: balancer.bpf.c compiled with Katran's flags (-O2, BTF from -g, llc -march=bpf)."""
    for tool in ("clang", "llc"):
        if shutil.which(tool) is None:
            raise KatranUnavailable(f"{tool} not found (Debian packages clang, llvm)")
    obj = Path(out_dir) / f"{name}.o"
    cflags = ["-I", str(SOURCES), "-D__KERNEL__", *defines, "-Wno-unused-value", "-Wno-pointer-sign",
              "-Wno-compare-distinct-pointer-types", "-O2", "-emit-llvm", "-c", "-g"]
    src = SOURCES / "katran" / "lib" / "bpf" / "balancer.bpf.c"
    ir = subprocess.run(["clang", *cflags, str(src), "-o", "-"], capture_output=True, timeout=120)
    if ir.returncode != 0:
        raise KatranUnavailable("clang failed: " + ir.stderr.decode(errors="replace")[-800:])
    llc = subprocess.run(["llc", "-march=bpf", "-filetype=obj", "-o", str(obj)], input=ir.stdout,
                         capture_output=True, timeout=120)
    if llc.returncode != 0:
        raise KatranUnavailable("llc failed: " + llc.stderr.decode(errors="replace")[-800:])
    return obj


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    vp, u32 = ctypes.c_void_p, ctypes.c_uint32
    sigs = {
        "bpf_object__open_file": ([ctypes.c_char_p, vp], vp),
        "bpf_object__find_map_by_name": ([vp, ctypes.c_char_p], vp),
        "bpf_object__find_program_by_name": ([vp, ctypes.c_char_p], vp),
        "bpf_object__load": ([vp], ctypes.c_int),
        "bpf_object__close": ([vp], None),
        "bpf_map__set_max_entries": ([vp, u32], ctypes.c_int),
        "bpf_map__fd": ([vp], ctypes.c_int),
        "bpf_map__key_size": ([vp], u32),
        "bpf_map__value_size": ([vp], u32),
        "bpf_program__fd": ([vp], ctypes.c_int),
        "bpf_program__set_expected_attach_type": ([vp, ctypes.c_int], ctypes.c_int),
        "bpf_map_create": ([ctypes.c_int, ctypes.c_char_p, u32, u32, u32, vp], ctypes.c_int),
        "bpf_map_update_elem": ([ctypes.c_int, vp, vp, ctypes.c_uint64], ctypes.c_int),
        "bpf_map_lookup_elem": ([ctypes.c_int, vp, vp], ctypes.c_int),
        "bpf_map_update_batch": ([ctypes.c_int, vp, vp, ctypes.POINTER(u32), vp], ctypes.c_int),
        "libbpf_num_possible_cpus": ([], ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno() or -rc
        raise KatranUnavailable(f"{what}: {os.strerror(err)} (errno {err})")
    return rc


def _addr16(ip: str) -> bytes:
    """Katran's address union: IPv4 in the first 4 bytes (network order), the rest zero."""
    return ipaddress.IPv4Address(ip).packed + bytes(12)


class Katran:
    """One loaded balancer.bpf.o with its maps; close() frees it. With `lrus_of`, its
    per-CPU LRUs (the connection table) are this one's too: two builds, one table."""

    def __init__(self, obj_path: Path, lru_entries_per_cpu: int, lrus_of: Katran | None = None):
        self._lib = lib = _lib()
        self._obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
        if not self._obj:
            _check(-1, f"bpf_object__open_file({obj_path})")
        self._lru_fds: list[int] = []
        self._owns_lrus = lrus_of is None
        self.lru_entries_per_cpu = lru_entries_per_cpu if lrus_of is None else lrus_of.lru_entries_per_cpu
        try:
            # one VIP: its ring only (the stock map holds MAX_VIPS rings, 128 MiB); the
            # QUIC server-id array is never read for a TCP VIP. An array lookup costs the
            # same whatever its size.
            lib.bpf_map__set_max_entries(self._map("ch_rings"), RING_SIZE)
            lib.bpf_map__set_max_entries(self._map("server_id_map"), 1)
            prog = lib.bpf_object__find_program_by_name(self._obj, PROGRAM.encode())
            if not prog:
                raise KatranUnavailable(f"program {PROGRAM} not in balancer.bpf.o")
            # libbpf gives SEC("xdp") the attach type BPF_XDP, BCC none; the kernel (6.17+) tail-calls
            # only between programs of one attach type, and bench.c's wrapper (BCC) tail-calls this one
            lib.bpf_program__set_expected_attach_type(prog, 0)
            _check(lib.bpf_object__load(self._obj), "loading balancer.bpf.o (verifier log above)")
            self.prog_fd = _check(lib.bpf_program__fd(prog), "program fd")
            self.ncpus = _check(lib.libbpf_num_possible_cpus(), "possible CPUs")
            fallback = self._map("fallback_cache")
            key_size, value_size = lib.bpf_map__key_size(fallback), lib.bpf_map__value_size(fallback)
            for cpu in range(self.ncpus):  # KatranLb::initLrus: one LRU per CPU, total/ncpus each
                if lrus_of is None:
                    fd = _check(lib.bpf_map_create(BPF_MAP_TYPE_LRU_HASH, b"katran_lru", key_size, value_size,
                                                   lru_entries_per_cpu, None), "creating a per-CPU LRU")
                    self._lru_fds.append(fd)
                else:
                    fd = lrus_of._lru_fds[cpu]
                self._update("lru_mapping", ctypes.c_uint32(cpu), ctypes.c_uint32(fd))
        except BaseException:
            self.close()
            raise

    def _map(self, name: str) -> int:
        m = self._lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise KatranUnavailable(f"map {name} not in balancer.bpf.o")
        return m

    def _fd(self, name: str) -> int:
        return self._lib.bpf_map__fd(self._map(name))

    def _update(self, name: str, key, value) -> None:
        m = self._map(name)
        assert ctypes.sizeof(key) == self._lib.bpf_map__key_size(m), name
        assert ctypes.sizeof(value) == self._lib.bpf_map__value_size(m), name
        _check(self._lib.bpf_map_update_elem(self._lib.bpf_map__fd(m), ctypes.byref(key), ctypes.byref(value), 0),
               f"updating {name}")

    def put_vip(self, vip: str, port: int, proto: str, ring: list[str], gateway_mac: str) -> dict[str, int]:
        """vip:port/proto balanced over `ring` (RING_SIZE backend IPs, Maglev order), as
        KatranLb::addVip + addRealForVip + the default-MAC call do; returns real id per IP."""
        assert len(ring) == RING_SIZE
        ids = {ip: i + 1 for i, ip in enumerate(sorted(set(ring)))}  # real id 0 means "no real"
        for ip, real in ids.items():  # struct real_definition {union addr; u8 flags;} -> 20 bytes
            self._update("reals", ctypes.c_uint32(real), (ctypes.c_uint8 * 20)(*_addr16(ip), 0, 0, 0, 0))
        keys = (ctypes.c_uint32 * RING_SIZE)(*range(RING_SIZE))  # vip_num 0: slots 0..RING_SIZE-1
        values = (ctypes.c_uint32 * RING_SIZE)(*(ids[ip] for ip in ring))
        count = ctypes.c_uint32(RING_SIZE)
        _check(self._lib.bpf_map_update_batch(self._fd("ch_rings"), keys, values, ctypes.byref(count), None),
               "writing the Maglev ring")
        # struct vip_definition {union addr; __u16 port (network order); __u8 proto;} -> 20 bytes
        key = (ctypes.c_uint8 * 20)(*_addr16(vip), *port.to_bytes(2, "big"), IPPROTO[proto], 0)
        self._update("vip_map", key, (ctypes.c_uint32 * 2)(0, 0))  # vip_meta {flags 0, vip_num 0}
        mac = bytes.fromhex(gateway_mac.replace(":", "")) + bytes(2)
        self._update("ctl_array", ctypes.c_uint32(0), (ctypes.c_uint8 * 8)(*mac))
        return ids

    def counters(self) -> dict[str, int]:
        """Katran's global counters summed over CPUs (v1 = packets, or the first of a pair)."""
        fd = self._fd("stats")
        out = {}
        names = {"tx": (XDP_TX_CNTR, 0), "pass": (XDP_PASS_CNTR, 0), "drop": (XDP_DROP_CNTR, 0),
                 "total": (XDP_TOTAL_CNTR, 0), "vip_packets": (LRU_CNTRS, 0), "lru_misses": (LRU_CNTRS, 1),
                 "syn_misses": (LRU_MISS_CNTR, 0), "non_syn_misses": (LRU_MISS_CNTR, 1)}
        for name, (index, half) in names.items():
            values = (ctypes.c_uint64 * (2 * self.ncpus))()  # struct lb_stats {u64 v1, v2} per CPU
            _check(self._lib.bpf_map_lookup_elem(fd, ctypes.byref(ctypes.c_uint32(MAX_VIPS + index)), values),
                   "reading stats")
            out[name] = sum(values[2 * cpu + half] for cpu in range(self.ncpus))
        return out

    def close(self) -> None:
        for fd in self._lru_fds if self._owns_lrus else ():
            os.close(fd)
        self._lru_fds = []
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None


def upstream() -> str:
    """owner/name@commit of the vendored sources (dataplane/bench/katran/UPSTREAM)."""
    fields = dict(line.split(": ", 1) for line in (SOURCES / "UPSTREAM").read_text().splitlines() if ": " in line)
    return f"{fields['repository']}@{fields['commit']}"


def maglev_ring(weights: Mapping[str, int]) -> list[str]:
    """The VIP's ring: backend IP per slot, from Fabric's Maglev builder at Katran's ring size."""
    from agent.maglev import build_maglev_table

    return [key.split(":")[0] for key in build_maglev_table(dict(weights), RING_SIZE)]
