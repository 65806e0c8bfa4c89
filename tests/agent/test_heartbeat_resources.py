"""What a node offers to replicas: its CPU count and MemTotal less a host reserve."""

from __future__ import annotations

import os

from agent.heartbeat import allocatable_memory_gib, read_host_resources

MEMINFO = "MemTotal:       {total} kB\nMemFree:         1048576 kB\nMemAvailable:    2097152 kB\n"


def test_allocatable_memory_is_total_less_reserve_not_available():
    # 256 GiB total, 2 GiB available (VMs pin the rest): allocatable stays 90 % of the total.
    assert allocatable_memory_gib(MEMINFO.format(total=256 * 1024 * 1024)) == 230.4
    # A small host keeps at least 2 GiB for itself.
    assert allocatable_memory_gib(MEMINFO.format(total=8 * 1024 * 1024)) == 6.0
    assert allocatable_memory_gib(MEMINFO.format(total=1024 * 1024)) == 0.0
    assert allocatable_memory_gib("garbage") == 0.0


def test_host_resources_read_from_proc(tmp_path):
    (tmp_path / "meminfo").write_text(MEMINFO.format(total=64 * 1024 * 1024))
    res = read_host_resources(tmp_path)
    assert res.cpu_free == (os.cpu_count() or 1)
    assert res.memory_free_gib == 57.6
