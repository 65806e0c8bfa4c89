"""Shared fixtures for dataplane tests: skip without root/BCC, per-test pin dirs."""

from __future__ import annotations

import shutil
import uuid

import pytest

from tests.support.bpf import bpf_missing


@pytest.fixture(scope="session")
def require_bpf():
    reason = bpf_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def pin_dir(require_bpf):
    path = f"/sys/fs/bpf/fabric-test-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)
