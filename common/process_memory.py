"""Where a process's resident memory is, for telling a leak from allocator fragmentation (the
soak's per-gateway breakdown, gateway.heap_profile's reports). Linux and glibc only; read-only.

RSS that grows while the live Python heap does not is garbage waiting for the collector (a
heap report's ``cyclic_garbage``) or memory the allocators hold free (``malloc_stats``: ``free``
grows while ``in_use`` does not; ``malloc_trim`` gives it back).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from collections.abc import Callable


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_stats() -> dict | None:
    """glibc's mallinfo2 in MiB, over every arena: ``heap`` (sbrk and arena heaps), ``mmapped``
    (large blocks), ``in_use`` and ``free`` (held by malloc, not returned to the system: what
    fragmentation looks like). None where glibc has no mallinfo2 (< 2.33, musl)."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    mib = 1024 * 1024
    return {"heap": round(m.arena / mib, 1), "mmapped": round(m.hblkhd / mib, 1),
            "in_use": round(m.uordblks / mib, 1), "free": round(m.fordblks / mib, 1)}


def rss_by_mapping(pid: int | str = "self") -> dict:
    """Resident MiB by kind of mapping (/proc/PID/smaps): ``brk`` (malloc's main heap),
    ``thread_arenas`` (glibc's per-thread arenas: anonymous, 64 MiB aligned), ``anon`` (other
    anonymous memory: pymalloc's 1 MiB arenas, which the kernel merges when adjacent, large
    mallocs, thread stacks, tracemalloc's tables) and ``files`` (code and data of the interpreter
    and its libraries)."""
    out = dict.fromkeys(("brk", "thread_arenas", "anon", "files"), 0)
    cur = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(maxsplit=6)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's first line
                lo = int(head[0].split("-")[0], 16)
                name = head[5].strip() if len(head) > 5 else ""
                if name == "[heap]":
                    cur = "brk"
                elif name.startswith("/"):
                    cur = "files"
                elif name:
                    cur = None  # [stack], [vdso] ...
                elif lo % (64 << 20) == 0 and head[1] == "rw-p":
                    cur = "thread_arenas"
                else:
                    cur = "anon"
            elif head[0] == "Rss:" and cur is not None:
                out[cur] += int(head[1])
    return {k: round(v / 1024, 1) for k, v in out.items()}


def malloc_trim() -> bool | None:
    """glibc's malloc_trim(0): give the free pages of every arena back to the system. True when
    some memory was released, None without glibc. RSS before and after tells how much of a
    process's growth was memory malloc held free (fragmentation), not live objects."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(fn(0))


async def reclaim_every(secs: float, collect: Callable[[], int] = gc.collect,
                        trim: Callable[[], bool | None] = malloc_trim) -> None:
    """Every SECS until cancelled: a full garbage collection on this (the event loop's) thread,
    then ``trim`` (malloc_trim) from a worker thread. For a process that froze its start-up heap
    and collects its old generation rarely (the gateway's quiet_gc): garbage in reference cycles
    that outlived two young collections (a WebSocket session's tasks, events and buffers) waits
    for a full collection, which the collector's own rule put off for tens of minutes; the soak
    saw RSS climb ~5 MB a minute (docs/reliability.md "What grew in the gateway"). Only the
    objects made since the freeze are scanned (1-6 ms measured with 20,000 live and 4,000 dead)."""
    while True:
        await asyncio.sleep(secs)
        collect()
        await asyncio.to_thread(trim)
