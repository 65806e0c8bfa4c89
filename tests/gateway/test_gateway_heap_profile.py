"""gateway.heap_profile: FABRIC_GATEWAY_TRACEMALLOC parsing, a report naming the site that grew,
written 0600 in a 0700 directory, and SIGUSR2 writing one."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from gateway.heap_profile import HeapProfiler, frames_from_env, start
from lab.rigs.polling import wait_for


def test_frames_from_env_is_off_unless_set_and_names_the_variable_when_bad():
    assert frames_from_env({}) is None
    assert frames_from_env({"FABRIC_GATEWAY_TRACEMALLOC": "0"}) is None
    assert frames_from_env({"FABRIC_GATEWAY_TRACEMALLOC": "native"}) == 0
    assert frames_from_env({"FABRIC_GATEWAY_TRACEMALLOC": "1"}) == 1
    assert frames_from_env({"FABRIC_GATEWAY_TRACEMALLOC": "64"}) == 64
    for bad in ("65", "-1", "yes", "1.5"):
        with pytest.raises(ValueError, match="FABRIC_GATEWAY_TRACEMALLOC"):
            frames_from_env({"FABRIC_GATEWAY_TRACEMALLOC": bad})
    assert start(__import__("pathlib").Path("/nonexistent"), None) is None


def _grow(n: int) -> list:
    return [bytearray(2048) for _ in range(n)]  # ~2 MB from this one line


@pytest.fixture
def profiler(tmp_path):
    was = tracemalloc.is_tracing()
    p = HeapProfiler(tmp_path / "heap-profile", 1, caches=lambda: {"explanations": 7})
    p.start()
    yield p
    if not was:
        tracemalloc.stop()


def test_a_report_names_the_line_that_grew_and_is_private(profiler, tmp_path):
    first = profiler.write()
    kept = _grow(1000)
    second = profiler.write()
    assert stat.S_IMODE(os.stat(tmp_path / "heap-profile").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(second).st_mode) == 0o600
    assert "growth_since_first" not in json.loads(first.read_text())
    report = json.loads(second.read_text())
    assert report["caches"] == {"explanations": 7}
    top = report["growth_since_previous"][0]
    assert top["where"][0].endswith(f"test_gateway_heap_profile.py:{_grow.__code__.co_firstlineno + 1}")
    assert top["count_diff"] >= 1000 and top["kb_diff"] >= 2000
    assert report["growth_since_first"][0]["where"] == top["where"]
    assert set(report["rss_mb"]) >= {"brk", "thread_arenas", "anon", "files"}
    assert report["trim"]["rss_mb_after"] <= report["trim"]["rss_mb_before"] + 1
    del kept


def test_native_reports_need_no_tracemalloc(tmp_path):
    was = tracemalloc.is_tracing()
    p = HeapProfiler(tmp_path / "hp", 0)
    p.start()
    assert tracemalloc.is_tracing() == was  # "native" starts nothing
    p.write()
    kept = [[i] for i in range(5000)]  # 5000 more lists: gc-tracked objects
    report = json.loads(p.write().read_text())
    assert "top" not in report and "traced_kb" not in report
    assert report["types_growth_since_previous"]["list"] >= 5000
    assert report["malloc"]["in_use"] > 0 and report["rss_mb"]["files"] > 1
    del kept


def test_sigusr2_writes_a_report(profiler, tmp_path):
    old = signal.getsignal(signal.SIGUSR2)
    try:
        profiler.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        wait_for(lambda: list((tmp_path / "heap-profile").glob("heap-*.json")), 30, "a heap report", interval=0.05)
    finally:
        signal.signal(signal.SIGUSR2, old)
    reports = list((tmp_path / "heap-profile").glob(f"heap-{os.getpid()}-*.json"))
    assert len(reports) == 1
    assert json.loads(reports[0].read_text())["pid"] == os.getpid()


def test_reclaim_secs_defaults_to_a_minute_and_0_turns_it_off():
    from gateway import settings as gs

    assert gs.load({}).reclaim_secs == 60.0
    assert gs.load({"FABRIC_GATEWAY_RECLAIM_SECS": "0"}).reclaim_secs is None
    assert gs.load({"FABRIC_GATEWAY_RECLAIM_SECS": "30"}).reclaim_secs == 30.0
    for bad in ("0.5", "3601", "x", "-1"):
        with pytest.raises(gs.SettingsError, match="FABRIC_GATEWAY_RECLAIM_SECS"):
            gs.load({"FABRIC_GATEWAY_RECLAIM_SECS": bad})


RECLAIM_SCENARIO = """
import asyncio, contextlib, gc, json, weakref
from common.process_memory import reclaim_every
from gateway.app import quiet_gc

class Session:  # a WebSocket session's objects point at each other
    pass

quiet_gc()  # as the gateway starts: start-up heap frozen, young collections rare
alive = []
for _ in range(2000):
    a, b = Session(), Session()
    a.peer, b.peer = b, a
    alive.append(a)
gc.collect(1)  # they outlive the young collections (a session spans several): now old
refs = [weakref.ref(a) for a in alive]
del alive, a, b  # garbage now, in cycles, in the old generation
junk = [[i] for i in range(200_000)]  # allocations enough for young collections to run
del junk
before = sum(r() is not None for r in refs)

async def one_tick():
    task = asyncio.create_task(reclaim_every(0.01, trim=lambda: None))
    await asyncio.sleep(0.1)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

asyncio.run(one_tick())
print(json.dumps({"before": before, "after": sum(r() is not None for r in refs)}))
"""


def test_garbage_in_old_cycles_waits_for_a_full_collection_and_reclaim_frees_it():
    """Why the gateway reclaims on a timer: with quiet_gc's thresholds, cycles that became
    garbage in the old generation are all still there after 200k allocations; one reclaim
    tick frees every one."""
    out = subprocess.run([sys.executable, "-c", RECLAIM_SCENARIO], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert json.loads(out.stdout) == {"before": 2000, "after": 0}


def test_the_hmac_secret_and_the_tracemalloc_frames_are_settings_read_at_start(tmp_path):
    from gateway import settings as gs

    assert gs.load({}).key_hmac_secret is None  # fabric-gateway serve then refuses to start, saying so
    s = gs.load({"FABRIC_KEY_HMAC_SECRET": " k3y-value ", "FABRIC_GATEWAY_TRACEMALLOC": "native"})
    assert s.key_hmac_secret == b"k3y-value" and s.heap_frames == 0 and "k3y-value" not in repr(s)
    with pytest.raises(gs.SettingsError, match="FABRIC_KEY_HMAC_SECRET_FILE"):
        gs.load({"FABRIC_KEY_HMAC_SECRET_FILE": str(tmp_path / "missing")})
    with pytest.raises(gs.SettingsError, match="FABRIC_GATEWAY_TRACEMALLOC"):
        gs.load({"FABRIC_GATEWAY_TRACEMALLOC": "lots"})
