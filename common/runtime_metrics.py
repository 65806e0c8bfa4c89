"""Runtime gauges every Fabric process exposes on its /metrics: what a soak watches for growth.

    fabric_process_resident_memory_bytes   RSS of this process (/proc/self/statm)
    fabric_process_open_fds                open file descriptors (/proc/self/fd)
    fabric_process_threads                 live Python threads
    fabric_process_asyncio_tasks           tasks not yet done on the process's event loop

Each process has its own registry, so ``install(registry)`` adds a collector to it; the loop
whose tasks are counted is bound at startup (``collector.bind()`` inside the loop, or the
``lifespan(collector)`` context for a FastAPI app without one of its own). Until bound, and
when called from inside a running loop, the running loop is used; with neither, tasks read 0.
"""

from __future__ import annotations

import asyncio
import os
import threading
from contextlib import asynccontextmanager

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def open_fds(pid: int | str = "self") -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class RuntimeCollector:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()

    def _tasks(self) -> int:
        loop = self._loop
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return 0
        if loop.is_closed():
            return 0
        # all_tasks retries internally when the loop's task set changes while it is read
        return sum(1 for t in asyncio.all_tasks(loop) if not t.done())

    def collect(self):
        for name, doc, value in (
            ("fabric_process_resident_memory_bytes", "Resident memory of this process", rss_bytes()),
            ("fabric_process_open_fds", "Open file descriptors of this process", open_fds()),
            ("fabric_process_threads", "Live Python threads in this process", threading.active_count()),
            ("fabric_process_asyncio_tasks", "Unfinished asyncio tasks on this process's event loop",
             self._tasks()),
        ):
            yield GaugeMetricFamily(name, doc, value=value)


def install(registry: CollectorRegistry) -> RuntimeCollector:
    collector = RuntimeCollector()
    registry.register(collector)
    return collector


def lifespan(collector: RuntimeCollector):
    """A FastAPI/Starlette lifespan that only binds COLLECTOR to the serving loop."""
    @asynccontextmanager
    async def _lifespan(_app):
        collector.bind()
        yield

    return _lifespan
