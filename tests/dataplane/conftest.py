"""Shared fixtures for dataplane tests: skip without root/BCC, per-test pin dirs."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest


def _bpf_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root for BPF"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "BCC (python3-bpfcc) is not installed"
    if not os.path.isdir("/sys/fs/bpf"):
        return "no bpffs at /sys/fs/bpf"
    return None


@pytest.fixture(scope="session")
def require_bpf():
    reason = _bpf_missing()
    if reason:
        pytest.skip(reason)


def remove_pins(pin_dir: str) -> None:
    shutil.rmtree(pin_dir, ignore_errors=True)


@pytest.fixture
def pin_dir(require_bpf):
    path = f"/sys/fs/bpf/fabric-test-{uuid.uuid4().hex[:8]}"
    yield path
    remove_pins(path)
