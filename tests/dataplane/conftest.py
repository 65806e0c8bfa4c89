"""Shared fixtures for dataplane tests: skip without root/BCC, per-test pin dirs."""

from __future__ import annotations

import shutil

import pytest

from lab.rigs.bpf import new_pin_dir, shared_plane


@pytest.fixture
def pin_dir(require_bpf):
    path = new_pin_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


# One compiled program per kind for the packet-table modules that add their own
# VIPs (each compile costs seconds): lifecycle and ICMP tests share them. require_bpf
# and plain_plane (no node_ip) are in tests/conftest.py: the agent API test shares it.
SHARED_NODE_IP = "10.2.0.1"


@pytest.fixture(scope="session")
def snat_plane(require_bpf):
    """node_ip 10.2.0.1: backends without a bridge route (all, on this host) are source-NATed."""
    yield from shared_plane(SHARED_NODE_IP)
