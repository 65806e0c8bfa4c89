"""The real BPF dataplane in tests: whether this host can run it (root, BCC, bpffs), fresh pin dirs."""

from __future__ import annotations

import os
import shutil
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


# Tests make small flow tables: the agent's default (1M entries x 2) costs ~200 MiB each.
TEST_FLOW_ENTRIES = 65536


def open_dataplane(pin_dir: str, node_ip: str | None = None, **kwargs):
    """A Dataplane on pin_dir with test-sized flow tables; node_ip written as attach would."""
    from agent.dataplane import Dataplane

    kwargs.setdefault("flow_entries", TEST_FLOW_ENTRIES)
    plane = Dataplane(pin_dir=pin_dir, **kwargs)
    if node_ip:
        plane.configure(node_ip=node_ip)
    return plane


def shared_plane(node_ip: str | None):
    """A session-long Dataplane on its own pin dir (one compile), removed afterwards."""
    path = new_pin_dir()
    plane = open_dataplane(path, node_ip)
    yield plane
    plane.close()
    shutil.rmtree(path, ignore_errors=True)
