"""Whether this host can run the real BPF dataplane (root, BCC, bpffs)."""

from __future__ import annotations

import os


def bpf_missing() -> str | None:
    """Why the BPF dataplane cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root for BPF"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "BCC (python3-bpfcc) is not installed"
    if not os.path.isdir("/sys/fs/bpf"):
        return "no bpffs at /sys/fs/bpf"
    return None
