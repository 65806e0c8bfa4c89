"""Shared fixtures for dataplane tests: skip without root/BCC, per-test pin dirs."""

from __future__ import annotations

import shutil

import pytest

from tests.support.bpf import bpf_missing, new_pin_dir, open_dataplane


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


def _shared_plane(node_ip: str | None):
    path = new_pin_dir()
    plane = open_dataplane(path, node_ip)
    yield plane
    plane.close()
    shutil.rmtree(path, ignore_errors=True)


# One compiled program per kind for the packet-table modules that add their own
# VIPs (each compile costs seconds): lifecycle and ICMP tests share them.
SHARED_NODE_IP = "10.2.0.1"


@pytest.fixture(scope="session")
def plain_plane(require_bpf):
    """No node_ip: every backend is reached without source NAT."""
    yield from _shared_plane(None)


@pytest.fixture(scope="session")
def snat_plane(require_bpf):
    """node_ip 10.2.0.1: backends without a bridge route (all, on this host) are source-NATed."""
    yield from _shared_plane(SHARED_NODE_IP)
