"""common.runtime_metrics: RSS, open fds, threads and unfinished asyncio tasks of this process,
read through a registry the way /metrics serves them."""

from __future__ import annotations

import asyncio
import os
import threading

from prometheus_client import CollectorRegistry

from common import runtime_metrics


def sample(reg: CollectorRegistry, name: str) -> float:
    value = reg.get_sample_value(name)
    assert value is not None, name
    return value


def test_tasks_count_the_bound_loop_from_another_thread():
    reg = CollectorRegistry()
    collector = runtime_metrics.install(reg)
    assert sample(reg, "fabric_process_asyncio_tasks") == 0  # no loop bound, none running here

    async def main() -> tuple[float, float, float]:
        collector.bind()
        base = await asyncio.to_thread(sample, reg, "fabric_process_asyncio_tasks")  # a scrape's thread
        sleepers = [asyncio.create_task(asyncio.sleep(60)) for _ in range(7)]
        await asyncio.sleep(0)
        during = await asyncio.to_thread(sample, reg, "fabric_process_asyncio_tasks")
        for t in sleepers:
            t.cancel()
        await asyncio.gather(*sleepers, return_exceptions=True)
        after = await asyncio.to_thread(sample, reg, "fabric_process_asyncio_tasks")
        return base, during, after

    base, during, after = asyncio.run(main())
    assert base >= 1 and during == base + 7 and after == base
    assert sample(reg, "fabric_process_asyncio_tasks") == 0  # the bound loop is closed now


def test_rss_fds_and_threads_follow_the_process():
    reg = CollectorRegistry()
    runtime_metrics.install(reg)
    assert sample(reg, "fabric_process_resident_memory_bytes") > 10 * 2**20  # a Python process with imports
    fds = sample(reg, "fabric_process_open_fds")
    r, w = os.pipe()
    try:
        assert sample(reg, "fabric_process_open_fds") == fds + 2
    finally:
        os.close(r)
        os.close(w)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert sample(reg, "fabric_process_threads") == threading.active_count()
    finally:
        stop.set()
        t.join()
    assert runtime_metrics.rss_bytes(os.getpid()) > 0 and runtime_metrics.open_fds(os.getpid()) > 0
    assert runtime_metrics.rss_bytes(2**22 + 7) == 0 and runtime_metrics.open_fds(2**22 + 7) == 0
