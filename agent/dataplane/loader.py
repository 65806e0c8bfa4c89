"""Compile dataplane/bpf/maglev.c with BCC and load its two programs.

Maps are declared pinned (BPF_TABLE_PINNED): the first load creates them under
pin_dir, later loads (a restarted agent, the CLI) re-open the same maps, so
flows and tables survive the process. pin_dir must be on a bpffs in the host's
mount namespace (`ip netns exec` mounts a fresh one: pins made there vanish).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from common.errors import InvalidInput

BPF_DIR = Path(__file__).resolve().parents[2] / "dataplane" / "bpf"
MAX_SERVICES = 32
MAX_BACKENDS = 4096
FLOW_ENTRIES = 65536


@dataclass(frozen=True)
class Layout:
    """Compile-time sizes; the config map records table_size so a mismatch is caught."""

    table_size: int
    max_services: int = MAX_SERVICES
    max_backends: int = MAX_BACKENDS
    flow_entries: int = FLOW_ENTRIES

    def cflags(self, pin_dir: str) -> list[str]:
        return [
            f"-I{BPF_DIR}",
            f'-DPIN_DIR="{pin_dir}"',
            f"-DTABLE_SIZE={self.table_size}",
            f"-DMAX_SERVICES={self.max_services}",
            f"-DMAX_BACKENDS={self.max_backends}",
            f"-DFLOW_ENTRIES={self.flow_entries}",
            "-Wno-unused-value",
            "-Wno-pointer-sign",
            "-Wno-compare-distinct-pointer-types",
        ]


@dataclass
class LoadedProgram:
    bpf: object  # bcc.BPF; typed loosely so importing this module needs no BCC
    xdp: object  # bcc function handle of xdp_maglev
    tc: object  # bcc function handle of tc_reverse_nat
    layout: Layout
    pin_dir: str


def ensure_pin_dir(pin_dir: str) -> None:
    if not pin_dir.startswith("/sys/fs/bpf/"):
        raise InvalidInput(f"pin_dir must be under /sys/fs/bpf, got {pin_dir}")
    os.makedirs(pin_dir, exist_ok=True)


def load(pin_dir: str, table_size: int) -> LoadedProgram:
    from bcc import BPF  # Debian python3-bpfcc; imported late so pure modules load anywhere

    layout = Layout(table_size=table_size)
    ensure_pin_dir(pin_dir)
    bpf = BPF(src_file=str(BPF_DIR / "maglev.c"), cflags=layout.cflags(pin_dir))
    xdp = bpf.load_func("xdp_maglev", BPF.XDP)
    tc = bpf.load_func("tc_reverse_nat", BPF.SCHED_CLS)
    return LoadedProgram(bpf=bpf, xdp=xdp, tc=tc, layout=layout, pin_dir=pin_dir)
