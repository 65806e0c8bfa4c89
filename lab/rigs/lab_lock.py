"""Hold /tmp/fabric-lab.lock while a test brings up the lab with its fixed names and ports.

A test run is normally already under `flock /tmp/fabric-lab.lock ...`; taking the lock again
from this process would then wait for ever on our own ancestor. So: if an ancestor holds it
(read from /proc/locks), go on; otherwise take it here (waiting for whoever else holds it).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.processes import ancestors

LOCK = Path("/tmp/fabric-lab.lock")


def held_by_ancestor() -> bool:
    try:
        inode = LOCK.stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return False
    mine = ancestors()
    for line in lines:
        parts = line.split()
        if (len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode)
                and int(parts[4]) in mine):
            return True
    return False


def lab_unavailable() -> str | None:
    """Why the lab cannot run here (not root, no iproute2/curl, no BCC), or None."""
    import shutil

    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, XDP)"
    if shutil.which("ip") is None or shutil.which("curl") is None:
        return "iproute2 and curl are needed"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "BCC (python3-bpfcc) is not importable"
    return None


@contextmanager
def lab_lock() -> Iterator[None]:
    if held_by_ancestor():
        yield
        return
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
