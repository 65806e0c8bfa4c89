"""common.process_memory: where a process's RSS is (smaps by kind of mapping) and what glibc's
malloc holds (mallinfo2), each checked against memory this test allocates."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import subprocess
import sys
from pathlib import Path

from common.process_memory import malloc_stats, reclaim_every, rss_by_mapping

MIB = 1024 * 1024


def test_a_large_touched_buffer_shows_as_anonymous_memory():
    before = rss_by_mapping()
    assert set(before) == {"brk", "thread_arenas", "anon", "files"}
    assert before["files"] > 1  # the interpreter's own code is resident
    buf = bytearray(b"x" * (48 * MIB))  # above malloc's mmap threshold: its own anonymous mapping
    after = rss_by_mapping()
    assert after["anon"] - before["anon"] >= 47
    del buf
    assert rss_by_mapping()["anon"] < after["anon"] - 40  # unmapped on free


def test_malloc_stats_count_blocks_in_use_and_freed():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = malloc_stats()
    assert before is not None and set(before) == {"heap", "mmapped", "in_use", "free"}
    blocks = [libc.malloc(64 * 1024) for _ in range(256)]  # 16 MiB in blocks malloc keeps in its heap
    during = malloc_stats()
    assert during["in_use"] - before["in_use"] >= 15.5
    for b in blocks:
        libc.free(b)
    after = malloc_stats()
    assert during["in_use"] - after["in_use"] >= 15.5


TRIM_SCENARIO = """
import ctypes, json
from common.process_memory import malloc_stats, malloc_trim
from common.runtime_metrics import rss_bytes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
malloc_trim()
blocks, guards = [], []
for _ in range(512):  # 32 MiB of 64 KiB blocks, each followed by a small live one
    blocks.append(libc.malloc(64 * 1024))
    libc.memset(blocks[-1], 1, 64 * 1024)  # resident
    guards.append(libc.malloc(64))
for b in blocks:
    libc.free(b)
held, free = rss_bytes(), malloc_stats()["free"]
released = malloc_trim()
print(json.dumps({"held": held, "free_mib": free, "released": released, "after": rss_bytes()}))
"""


def test_malloc_trim_gives_back_free_pages_between_live_blocks():
    """Freed blocks between live ones stay resident (malloc cannot shrink its heap past a live
    block): fragmentation, counted as malloc's ``free``. malloc_trim gives their pages back. In a
    fresh interpreter, so the heap's layout is known."""
    out = subprocess.run([sys.executable, "-c", TRIM_SCENARIO], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    r = json.loads(out.stdout)
    assert r["free_mib"] >= 24  # most of the 32 MiB freed (some reused holes), held by malloc
    assert r["released"] is True
    assert r["held"] - r["after"] >= 24 * MIB


def test_reclaim_every_collects_then_trims_on_its_period_until_cancelled():
    calls: list[str] = []

    async def main() -> int:
        task = asyncio.create_task(reclaim_every(0.01, lambda: calls.append("collect") or 0,
                                                 lambda: calls.append("trim")))
        while len(calls) < 6:
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        done = len(calls)
        await asyncio.sleep(0.05)
        return done

    done = asyncio.run(main())
    assert calls[:6] == ["collect", "trim"] * 3
    assert len(calls) == done  # nothing after the cancel
