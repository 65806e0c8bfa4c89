"""Shared fixtures for dataplane tests: skip without root/BCC, per-test pin dirs."""

from __future__ import annotations

import shutil

import pytest

from tests.support.bpf import bpf_missing, new_pin_dir


@pytest.fixture(scope="session")
def require_bpf():
    reason = bpf_missing()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def pin_dir(require_bpf):
    path = new_pin_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)
