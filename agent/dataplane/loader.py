"""Compile dataplane/bpf/maglev.c with BCC and load its two programs.

Maps are declared pinned (BPF_TABLE_PINNED): the first load creates them under
pin_dir, later loads (a restarted agent, the CLI) re-open the same maps, so
flows and tables survive the process. pin_dir must be on a bpffs in the host's
mount namespace (`ip netns exec` mounts a fresh one: pins made there vanish).
Pins are reused only when their layout record matches (pins.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.dataplane.pins import LAYOUT_VERSION, Meta
from common.errors import InvalidInput
from dataplane import BPF_DIR  # BCC needs the C as files on disk, which a checkout or an unpacked wheel gives

MAX_SERVICES = 32
MAX_BACKENDS = 4096
# flow_entries: how many flows each CPU's LRU list of the forward and reverse tables
# holds (the maps are made with flow_entries x possible CPUs, because the kernel splits
# a BPF_F_NO_COMMON_LRU map's entries evenly over the possible CPUs). A flood that one
# CPU receives therefore competes with that CPU's flows for a full flow_entries, as it
# did with one shared list, while inserts and hits stay on the CPU's own list and lock.
# Default: 1M per CPU up to 2 CPUs (a busy node keeps ~100k long-lived streams plus a
# minute of new ones at ~10k/s with room to spare), less per CPU on larger hosts so a
# table stays at 2M entries (about 400 MiB for both tables, printed at attach).
FLOW_ENTRIES = 1 << 20
FLOW_ENTRIES_BUDGET = 1 << 21  # default entries per map over all CPUs
MIN_FLOW_ENTRIES = 1024
MAX_FLOW_ENTRIES = 1 << 24
MAX_FLOW_MAP_ENTRIES = 1 << 27


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """The kernel's possible CPUs ("0-3,8-11"), over which it splits per-CPU LRU lists."""
    try:
        text = open(path).read().strip()
    except OSError:
        return os.cpu_count() or 1
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return max(count, 1)


def default_flow_entries(cpus: int | None = None) -> int:
    """Entries per CPU list by default: FLOW_ENTRIES, or FLOW_ENTRIES_BUDGET / CPUs when smaller."""
    cpus = cpus or possible_cpus()
    return max(MIN_FLOW_ENTRIES, min(FLOW_ENTRIES, FLOW_ENTRIES_BUDGET // cpus))


@dataclass(frozen=True)
class Layout:
    """Compile-time sizes; recorded in the meta map so a mismatch is caught."""

    table_size: int
    max_services: int = MAX_SERVICES
    max_backends: int = MAX_BACKENDS
    flow_entries: int = FLOW_ENTRIES
    # one LRU list per CPU (BPF_F_NO_COMMON_LRU); False only for the benchmark's ablation
    percpu_lru: bool = True
    # each CPU's list holds flow_entries (the map is flow_entries x CPUs); False: the map holds
    # flow_entries split over the CPUs (the layout before; kept for bench-xdp's side-by-side)
    percpu_full: bool = True
    cpus: int = 0  # possible CPUs; 0: read from the kernel

    def __post_init__(self) -> None:
        if not MIN_FLOW_ENTRIES <= self.flow_entries <= MAX_FLOW_ENTRIES:
            raise InvalidInput(f"flow entries must be {MIN_FLOW_ENTRIES}-{MAX_FLOW_ENTRIES}, got {self.flow_entries}")
        if self.cpus <= 0:
            object.__setattr__(self, "cpus", possible_cpus())

    @property
    def map_entries(self) -> int:
        """max_entries of each flow map."""
        if not (self.percpu_lru and self.percpu_full):
            return self.flow_entries
        return min(self.flow_entries * self.cpus, MAX_FLOW_MAP_ENTRIES)

    @property
    def meta(self) -> Meta:
        return Meta(layout_version=LAYOUT_VERSION, table_size=self.table_size, flow_entries=self.flow_entries,
                    max_services=self.max_services, max_backends=self.max_backends)

    def cflags(self, pin_dir: str) -> list[str]:
        return [
            f"-I{BPF_DIR}",
            f'-DPIN_DIR="{pin_dir}"',
            f"-DTABLE_SIZE={self.table_size}",
            f"-DMAX_SERVICES={self.max_services}",
            f"-DMAX_BACKENDS={self.max_backends}",
            f"-DFLOW_ENTRIES={self.flow_entries}",
            f"-DFLOW_MAP_ENTRIES={self.map_entries}",
            f"-DLAYOUT_VERSION={LAYOUT_VERSION}",
            f"-DFLOW_LRU_FLAGS={2 if self.percpu_lru else 0}",  # BPF_F_NO_COMMON_LRU
            "-Wno-unused-value",
            "-Wno-pointer-sign",
            "-Wno-compare-distinct-pointer-types",
        ]


@dataclass
class LoadedProgram:
    bpf: object  # bcc.BPF; typed loosely so importing this module needs no BCC
    xdp: object  # bcc function handle of xdp_maglev
    tc: object  # bcc function handle of tc_reverse_nat
    tc_reply: object  # bcc function handle of tc_reply_redirect
    layout: Layout
    pin_dir: str


def ensure_pin_dir(pin_dir: str) -> None:
    if not pin_dir.startswith("/sys/fs/bpf/") or "/../" in pin_dir or pin_dir.endswith("/.."):
        raise InvalidInput(f"pin_dir must be under /sys/fs/bpf, got {pin_dir}")
    os.makedirs(pin_dir, exist_ok=True)


def load(pin_dir: str, layout: Layout) -> LoadedProgram:
    """Compile and load; the caller has checked the pins' record and holds the writer lock."""
    from bcc import BPF  # Debian python3-bpfcc; imported late so pure modules load anywhere

    bpf = BPF(src_file=str(BPF_DIR / "maglev.c"), cflags=layout.cflags(pin_dir))
    xdp = bpf.load_func("xdp_maglev", BPF.XDP)
    tc = bpf.load_func("tc_reverse_nat", BPF.SCHED_CLS)
    tc_reply = bpf.load_func("tc_reply_redirect", BPF.SCHED_CLS)
    return LoadedProgram(bpf=bpf, xdp=xdp, tc=tc, tc_reply=tc_reply, layout=layout, pin_dir=pin_dir)


def map_memory_bytes(table) -> int:
    """Kernel memory a loaded map accounts for (fdinfo's memlock)."""
    try:
        with open(f"/proc/self/fdinfo/{table.map_fd}") as f:
            for line in f:
                if line.startswith("memlock:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0
