"""Opt-in heap profile of a gateway process, for finding what grows (scripts/soak --heap-profile).

``FABRIC_GATEWAY_TRACEMALLOC=N`` (N frames per allocation site, 1-64; unset or 0: off) starts
tracemalloc when the process starts; ``native`` turns the reports on without tracemalloc (whose
own tables and per-allocation cost change what is measured). Each SIGUSR2 then writes one report
into ``<state-dir>/heap-profile/`` (0700, the file 0600): with tracemalloc the traced size, the
top allocation sites and the sites that grew since the first report and since the previous one;
always the gc-tracked objects by type (and their change), the sizes of the gateway's own caches,
resident memory by kind of mapping and glibc malloc's figures (common.process_memory), and the
RSS before and after ``malloc_trim(0)`` (memory malloc held free and gave back: the report's one
side effect, harmless). Only the process's owner (or
root) can send the signal and read the files; nothing is served over HTTP. A report holds code
locations, type names and counts, never a value (no prompt, key or header).

Tracing costs CPU and memory on every allocation: this is for a soak or a lab, not production.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from common.private_fs import private_dir, write_private
from common.process_memory import malloc_stats, malloc_trim, rss_by_mapping
from common.runtime_metrics import rss_bytes

log = logging.getLogger("fabric.gateway")
ENV = "FABRIC_GATEWAY_TRACEMALLOC"
MAX_FRAMES = 64
TOP = 30
_SKIP = (tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
         tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"), tracemalloc.Filter(False, "<unknown>"))


def frames_from_env(env: dict[str, str]) -> int | None:
    """N from FABRIC_GATEWAY_TRACEMALLOC: None off, 0 reports without tracemalloc ("native");
    ValueError naming the variable when bad."""
    raw = env.get(ENV, "").strip()
    if raw in ("", "0"):
        return None
    if raw == "native":
        return 0
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_FRAMES:
        raise ValueError(f"{ENV}={raw!r}: expected native or a number of frames from 1 to {MAX_FRAMES} (0: off)")
    return int(raw)


def object_types() -> Counter:
    """gc-tracked objects by type name (what a leak of small objects shows up as)."""
    return Counter(type(o).__name__ for o in gc.get_objects())


def cyclic_garbage() -> dict:
    """A full collection that counts, by type, the unreachable objects it frees: garbage in
    reference cycles, which waits for the collector (rarely a full one: app.quiet_gc) and holds
    its memory until then."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        n = gc.collect()
        found = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.collect()  # now really freed
    return {"objects": n, "types": dict(found.most_common(TOP))}


def _rows(stats: dict, base: dict | None) -> list[dict]:
    """The TOP sites by size (base None) or by growth over BASE, as JSON rows."""
    def growth(item):
        size, count = item[1]
        was = base.get(item[0], (0, 0))
        return size - was[0], count - was[1]

    items = sorted(stats.items(), key=(lambda i: i[1][0]) if base is None else (lambda i: growth(i)[0]), reverse=True)
    out = []
    for tb, (size, count) in items[:TOP]:
        row = {"kb": round(size / 1024, 1), "count": count, "where": [f"{f.filename}:{f.lineno}" for f in tb]}
        if base is not None:
            d_size, d_count = growth((tb, (size, count)))
            row |= {"kb_diff": round(d_size / 1024, 1), "count_diff": d_count}
        out.append(row)
    return out


class HeapProfiler:
    """Snapshots on demand; keeps the first and the previous one to diff against."""

    def __init__(self, out_dir: Path, frames: int, caches: Callable[[], dict] | None = None):
        self.out_dir, self.frames, self.caches = out_dir, frames, caches
        self._first = self._prev = None
        self._prev_types: Counter | None = None
        self._n = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.frames and not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)

    def report(self) -> dict:
        garbage = cyclic_garbage()  # what is left is reachable
        types = object_types()  # before the snapshot, whose traces are tuples too
        stats = None
        if self.frames and tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot().filter_traces(_SKIP)
            stats = {s.traceback: (s.size, s.count) for s in snap.statistics("traceback" if self.frames > 1 else "lineno")}
            del snap  # only the per-site sums are kept between reports
        out = {"t": time.time(), "pid": os.getpid(), "gc_objects": sum(types.values()), "cyclic_garbage": garbage,
               "caches": self.caches() if self.caches else {}, "rss_mb": rss_by_mapping(), "malloc": malloc_stats()}
        out["trim"] = {"rss_mb_before": round(rss_bytes() / 2**20, 1), "released": malloc_trim(),
                       "rss_mb_after": round(rss_bytes() / 2**20, 1)}
        if stats is not None:
            current, peak = tracemalloc.get_traced_memory()
            out |= {"traced_kb": round(current / 1024, 1), "traced_peak_kb": round(peak / 1024, 1),
                    "top": _rows(stats, None)}
            if self._first is not None:
                out["growth_since_first"] = _rows(stats, self._first)
                out["growth_since_previous"] = _rows(stats, self._prev)
        if self._prev_types is not None:
            diff = Counter(types)
            diff.subtract(self._prev_types)
            out["types_growth_since_previous"] = dict(diff.most_common(TOP))
        out["types"] = dict(types.most_common(TOP))
        if self._first is None:
            self._first = stats
        self._prev, self._prev_types = stats, types
        return out

    def write(self) -> Path:
        with self._lock:
            data = self.report()
            self._n += 1
            path = private_dir(self.out_dir) / f"heap-{os.getpid()}-{self._n:04d}.json"
            tmp = path.with_suffix(".tmp")
            write_private(tmp, json.dumps(data, indent=1))
            tmp.replace(path)  # a reader never sees half a report
            return path

    def install(self) -> None:
        """SIGUSR2 -> one report, written from a thread (the event loop only starts it)."""
        def on_signal(_signum, _frame) -> None:
            threading.Thread(target=self._write_logged, name="heap-profile", daemon=True).start()

        signal.signal(signal.SIGUSR2, on_signal)

    def _write_logged(self) -> None:
        try:
            log.info("heap profile written to %s", self.write())
        except Exception:
            log.exception("heap profile could not be written")


def cache_sizes(app) -> dict:
    """Entries in each of the gateway's own caches and queues (read without locks: a report)."""
    import asyncio

    st = app.state
    out = {"routes": len(app._routes), "explanations": len(st.router._explained),
           "prefix_trees": len(st.router._trees), "prefix_nodes": sum(len(t) for t in st.router._trees.values()),
           "round_robin": len(st.router._rr), "in_flight_replicas": len(st.router._in_flight),
           "key_cache": len(st.auth._cache), "views": len(st.upstreams._views),
           "metric_children": len(st.metrics._children), "limit_locks": len(st.limits._locks),
           "audit_queue": len(st.audit._writer._items), "idle_upstream_hosts": len(getattr(st.client, "_idle", ()))}
    loop = st.metrics.runtime._loop
    out["asyncio_tasks"] = len(asyncio.all_tasks(loop)) if loop is not None and not loop.is_closed() else None
    return out


def start(state_dir: Path, frames: int | None) -> HeapProfiler | None:
    """A started profiler writing under STATE_DIR/heap-profile when FABRIC_GATEWAY_TRACEMALLOC is set
    (frames: GatewaySettings.heap_frames, read at start)."""
    if frames is None:
        return None
    profiler = HeapProfiler(state_dir / "heap-profile", frames)
    profiler.start()
    return profiler
