"""Exclusivity and exact counting under real OS processes, on both backends.

Each worker is a spawned process with its own store handle (its own SQLite connection or its
own etcd HTTP session), released together by a multiprocessing Event so the writes overlap.
"""

from __future__ import annotations

import multiprocessing
import threading

from common.store import open_store

CLAIMERS = 8
INCREMENTS = 200
JOIN_LIMIT_S = 120


def _claim(url: str, key: str, me: int, go, results) -> None:
    store = open_store(url)
    go.wait(30)
    results.put((me, store.create(key, f"owner-{me}")))
    store.close()


def _increment(url: str, key: str, times: int, go, results) -> None:
    store = open_store(url)
    go.wait(30)
    conflicts = 0
    for _ in range(times):
        while True:
            kv = store.get(key)
            if store.cas(key, str(int(kv.value) + 1), kv.mod_revision):
                break
            conflicts += 1
    results.put(conflicts)
    store.close()


def _run(target, arg_sets: list[tuple]) -> list:
    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, go, results)) for args in arg_sets]
    for proc in procs:
        proc.start()
    go.set()
    out = [results.get(timeout=JOIN_LIMIT_S) for _ in procs]
    for proc in procs:
        proc.join(JOIN_LIMIT_S)
        assert proc.exitcode == 0
    return out


def test_create_if_absent_has_exactly_one_winner(backend):
    key = backend["prefix"] + "gpu-reservations/node-1/0000:3b:00.0"
    outcomes = _run(_claim, [(backend["url"], key, i) for i in range(CLAIMERS)])
    winners = [me for me, won in outcomes if won]
    assert len(outcomes) == CLAIMERS
    assert len(winners) == 1
    store = open_store(backend["url"])
    assert store.get(key).value == f"owner-{winners[0]}"
    store.close()


def test_cas_increments_from_two_processes_are_exact(backend):
    key = backend["prefix"] + "counters/requests"
    store = open_store(backend["url"])
    store.put(key, "0")
    conflicts = _run(_increment, [(backend["url"], key, INCREMENTS)] * 2)
    assert store.get(key).value == str(2 * INCREMENTS)
    assert all(c >= 0 for c in conflicts)
    store.close()


def test_cas_increments_from_threads_sharing_one_handle(backend):
    """Threads of one process share a store object (the gateway's shape): still exact."""
    key = backend["prefix"] + "counters/threads"
    store = open_store(backend["url"])
    store.put(key, "0")

    def bump() -> None:
        for _ in range(50):
            while True:
                kv = store.get(key)
                if store.cas(key, str(int(kv.value) + 1), kv.mod_revision):
                    break

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_LIMIT_S)
    assert store.get(key).value == "200"
    store.close()
