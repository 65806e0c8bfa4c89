"""Exclusivity and exact counting under real OS processes, on both backends.

Each worker is a spawned process with its own store handle (its own SQLite connection or its
own etcd HTTP session), released together by a multiprocessing Event so the writes overlap.
"""

from __future__ import annotations

import multiprocessing
import threading

from common.store import open_store
from lab.rigs.polling import wait_for

CLAIMERS = 8
INCREMENTS = 200
JOIN_LIMIT_S = 120


def _open(where: tuple):
    url, access = where
    return open_store(url, access=access)


def _claim(where: tuple, key: str, me: int, go, results) -> None:
    store = _open(where)
    go.wait(30)
    results.put((me, store.create(key, f"owner-{me}")))
    store.close()


def _increment(where: tuple, key: str, times: int, go, results) -> None:
    store = _open(where)
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


def _where(backend: dict) -> tuple:
    return backend["url"], backend["access"]


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
    outcomes = _run(_claim, [(_where(backend), key, i) for i in range(CLAIMERS)])
    winners = [me for me, won in outcomes if won]
    assert len(outcomes) == CLAIMERS
    assert len(winners) == 1
    store = _open(_where(backend))
    assert store.get(key).value == f"owner-{winners[0]}"
    store.close()


def test_cas_increments_from_two_processes_are_exact(backend):
    key = backend["prefix"] + "counters/requests"
    store = _open(_where(backend))
    store.put(key, "0")
    conflicts = _run(_increment, [(_where(backend), key, INCREMENTS)] * 2)
    assert store.get(key).value == str(2 * INCREMENTS)
    assert all(c >= 0 for c in conflicts)
    store.close()


def test_cas_increments_from_threads_sharing_one_handle(backend):
    """Threads of one process share a store object (the gateway's shape): still exact."""
    key = backend["prefix"] + "counters/threads"
    store = _open(_where(backend))
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


def _lead(where: tuple, name: str, me: int, go, results) -> None:
    from common.store.locks import LeaseLock

    store = _open(where)
    lock = LeaseLock(store, name, holder=f"fabricd-{me}", ttl=30)
    go.wait(30)
    won = lock.try_acquire()
    results.put((me, won, lock.fence))
    store.close()  # the winner's lease outlives it: the test revokes it by reading the lock


def test_leader_lock_has_one_holder_across_processes(backend):
    from common.store.locks import lock_view

    name = backend["prefix"].strip("/").replace("/", "-") + "-placement"
    outcomes = _run(_lead, [(_where(backend), name, i) for i in range(4)])
    winners = [(me, fence) for me, won, fence in outcomes if won]
    assert len(winners) == 1
    store = _open(_where(backend))
    view = lock_view(store, name)
    assert view.holder == f"fabricd-{winners[0][0]}"
    assert view.fence == winners[0][1]
    store.revoke_lease(store.get(f"/fabric/locks/{name}").lease)
    assert lock_view(store, name).holder is None
    store.close()


def test_leader_lock_handover_and_expiry(backend):
    from common.store.locks import LeaseLock

    name = backend["prefix"].strip("/").replace("/", "-") + "-reconcile"
    store = _open(_where(backend))
    first = LeaseLock(store, name, holder="a", ttl=1)
    second = LeaseLock(store, name, holder="b", ttl=1)
    assert first.try_acquire() and first.held()
    assert second.try_acquire() is False and not second.held()
    assert first.keep_alive() is True
    first.release()
    assert not first.held()
    assert second.try_acquire() is True
    assert second.fence > 0
    old_fence = second.fence

    # b stops refreshing: its lease expires in the store and a takes over with a larger fence.
    wait_for(first.try_acquire, 10, "b's lease to expire", interval=0.2)  # a bound, not a timing assertion
    assert first.fence > old_fence
    assert second.keep_alive() is False and not second.held()
    first.release()
    store.close()
