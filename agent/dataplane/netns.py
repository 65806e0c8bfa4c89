"""Run a function inside a named network namespace without leaving the host's
mount namespace.

setns(CLONE_NEWNET) changes only the calling thread, so a short-lived helper
thread enters /var/run/netns/NAME, runs the function and exits; the agent's own
threads, and its view of /sys/fs/bpf, stay where they were. (`ip netns exec`
would also mount a fresh bpffs, hiding our pins.)
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from common.errors import NotFound

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """Call fn in network namespace `netns` (None: the caller's own) and return its result."""
    if netns is None:
        return fn()
    path = os.path.join(NETNS_DIR, netns)
    if "/" in netns or not os.path.exists(path):
        raise NotFound(f"network namespace {netns} not found under {NETNS_DIR}")
    box: dict[str, object] = {}

    def body() -> None:
        try:
            _setns(path)
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001  re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=body, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
