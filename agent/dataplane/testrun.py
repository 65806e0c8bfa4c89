"""BPF_PROG_TEST_RUN through libbpf.so.1's bpf_prog_test_run_opts (ctypes).

Used by the packet tests and scripts/bench-xdp: run a loaded XDP program on a
packet and get its return code, output bytes and the kernel's per-run time.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT = range(5)


class _TestRunOpts(ctypes.Structure):
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    ]


class _XdpMd(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("data", "data_end", "data_meta", "ingress_ifindex", "rx_queue_index", "egress_ifindex")]


@dataclass(frozen=True)
class RunResult:
    retval: int
    output: bytes
    duration_ns: int


def _libbpf() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.POINTER(_TestRunOpts)]
    lib.bpf_prog_test_run_opts.restype = ctypes.c_int
    return lib


def run_xdp(prog_fd: int, packet: bytes, repeat: int = 1, meta: int = 0, ingress_ifindex: int = 0) -> RunResult:
    """Run an XDP program once (or `repeat` times) on `packet`.

    The kernel refuses inputs shorter than an Ethernet header; `meta` (a
    multiple of 4, at most 32) turns the first bytes into XDP metadata so the
    program sees a shorter packet, which is how truncated Ethernet is tested.
    ingress_ifindex: the device (of the caller's network namespace) the packet
    arrives on, as the fib lookup sees it (default: loopback).
    """
    lib = _libbpf()
    data_in = ctypes.create_string_buffer(packet, len(packet))
    out_len = len(packet) + 256
    data_out = ctypes.create_string_buffer(out_len)
    opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts))
    opts.data_in = ctypes.cast(data_in, ctypes.c_void_p)
    opts.data_size_in = len(packet)
    opts.data_out = ctypes.cast(data_out, ctypes.c_void_p)
    opts.data_size_out = out_len
    opts.repeat = repeat
    ctx = None
    if meta or ingress_ifindex:
        ctx = _XdpMd(data=meta, data_end=len(packet), ingress_ifindex=ingress_ifindex)
        opts.ctx_in = ctypes.cast(ctypes.pointer(ctx), ctypes.c_void_p)
        opts.ctx_size_in = ctypes.sizeof(_XdpMd)
    if lib.bpf_prog_test_run_opts(prog_fd, ctypes.byref(opts)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN: {os.strerror(err)}")
    return RunResult(retval=opts.retval, output=data_out.raw[meta:opts.data_size_out], duration_ns=opts.duration)
