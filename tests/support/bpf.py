"""The real BPF dataplane in tests: whether this host can run it (root, BCC, bpffs), fresh pin dirs."""

from __future__ import annotations

import os
import uuid


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


def new_pin_dir() -> str:
    """A fresh bpffs directory name for one test's pinned maps (the caller removes it)."""
    return f"/sys/fs/bpf/fabric-test-{uuid.uuid4().hex[:8]}"
