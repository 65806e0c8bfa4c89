"""The gateway's endpoint views list the store once, then follow its changes (issue 49 item 4):
a refresh with nothing changed lists nothing and rebuilds no view; a change rebuilds only the
views made from it, and a change of readings alone none."""

from __future__ import annotations

import asyncio
import time

from common import keyspace
from common.schemas import EndpointStatus, InferenceEndpoint, Node, Replica, ReplicaObservation
from common.store.sqlite_store import SqliteStore
from gateway.upstreams import UpstreamCache
from lab.rigs.routing_plans import publish_plans
from lab.rigs.scale import CountingStore


def fleet(store, endpoints: int = 3, per: int = 4) -> None:
    now = time.time()
    store.put(keyspace.nodes("n"), Node(id="n", address="https://127.0.0.1:1", last_heartbeat=now).model_dump_json())
    for e in range(endpoints):
        d = f"d{e}"
        store.put(keyspace.endpoints(f"e{e}"), InferenceEndpoint(name=f"e{e}", deployment=d,
                                                                  status=EndpointStatus()).model_dump_json())
        for i in range(per):
            rid = f"{d}-{i}"
            store.put(keyspace.replicas(d, rid), Replica(replica_id=rid, deployment=d, ordinal=i, node="n",
                                                         phase="Ready", host=f"10.0.{e}.{i + 1}", port=8000,
                                                         ready=True).model_dump_json())
            store.put(keyspace.observations(rid), ReplicaObservation(replica_id=rid, scraped_at=now, ok=True)
                      .model_dump_json())
    publish_plans(store)


def test_a_refresh_lists_nothing_when_nothing_changed(tmp_path):
    raw = SqliteStore(tmp_path / "f.db")
    fleet(raw)
    store = CountingStore(raw)
    cache = UpstreamCache(store, ttl_secs=0.0)  # every call refreshes: the worst case for the store

    async def views():
        return [await cache.view(f"e{e}") for e in range(3)]

    first = asyncio.run(views())
    assert [len(v.replicas) for v in first] == [4, 4, 4]
    lists, built = store.calls.get("list", 0), cache.views_built
    assert asyncio.run(views()) == first
    assert (store.calls.get("list", 0), cache.views_built) == (lists, built)  # no list, no view rebuilt
    # One replica's queue moves: no view is rebuilt and nothing listed; the views' readings are
    # the copy's when they are read (LiveReadings), so the held view shows the new queue.
    raw.put(keyspace.observations("d1-2"), ReplicaObservation(replica_id="d1-2", scraped_at=time.time(), ok=True,
                                                              queue_depth=7).model_dump_json())
    again = asyncio.run(views())
    assert store.calls.get("list", 0) == lists and cache.views_built == built
    assert again[0] is first[0] and again[1] is first[1]
    assert again[1].queue_depths["d1-2"][0] == 7 and again[1].readings["d1-2"].queue == 7
    assert {r: again[1].readings[r].queue for r in ("d1-0", "d1-1", "d1-3")} == {"d1-0": 0, "d1-1": 0, "d1-3": 0}
    assert "d0-0" not in again[1].readings and "d0-0" in again[0].readings  # each view its own replicas
    # it fails now: it leaves the readings (and the queue depths) until it is ok again
    raw.put(keyspace.observations("d1-2"), ReplicaObservation(replica_id="d1-2", scraped_at=time.time(), ok=False,
                                                              error="ScrapeError").model_dump_json())
    failed = asyncio.run(views())[1]
    assert "d1-2" not in failed.readings and "d1-2" not in failed.queue_depths and len(failed.readings) == 3
    assert failed.queue_depths.get("d1-2") is None and sorted(failed.readings) == ["d1-0", "d1-1", "d1-3"]
    raw.put(keyspace.observations("d1-2"), ReplicaObservation(replica_id="d1-2", scraped_at=time.time(), ok=True,
                                                              queue_depth=7).model_dump_json())
    assert asyncio.run(views())[1].readings["d1-2"].queue == 7 and cache.views_built == built
    # A replica drains: its view is built again, and the gateway drops it at the next refresh.
    rep = Replica.model_validate_json(raw.get(keyspace.replicas("d2", "d2-0")).value)
    raw.put(keyspace.replicas("d2", "d2-0"), rep.model_copy(update={"draining": True}).model_dump_json())
    drained = asyncio.run(views())[2]
    assert [r.replica_id for r in drained.replicas] == ["d2-1", "d2-2", "d2-3"]
    assert "d2-0" not in drained.readings  # a replica the view no longer holds has no reading in it
    assert store.calls.get("list", 0) == lists and cache.views_built == built + 1
    cache.close()
    raw.close()


def test_an_endpoint_created_after_the_copy_answers_from_its_first_call(tmp_path):
    """A name the copy does not know brings the copy up to date (one shared fetch): an endpoint
    created since the copy was made answers at once (no 404 for a TTL); a name that does not
    exist, with nothing written since, is a 404 without a watch or a list."""
    import pytest

    from common.errors import NotFound

    raw = SqliteStore(tmp_path / "f.db")
    fleet(raw, endpoints=1)
    store = CountingStore(raw)
    cache = UpstreamCache(store, ttl_secs=3600.0)  # the copy would otherwise stay as it is for an hour

    async def view(name):
        return await cache.view(name)

    asyncio.run(view("e0"))
    reads = dict(store.calls)
    with pytest.raises(NotFound):
        asyncio.run(view("nope"))
    assert store.calls.get("changed_since", 0) == reads.get("changed_since", 0)  # a made-up name fetched nothing
    assert store.calls.get("list", 0) == reads.get("list", 0)
    raw.put(keyspace.endpoints("new"), InferenceEndpoint(name="new", deployment="d0",
                                                         status=EndpointStatus()).model_dump_json())
    publish_plans(raw)
    assert [r.replica_id for r in asyncio.run(view("new")).replicas] == ["d0-0", "d0-1", "d0-2", "d0-3"]
    cache.close()
    raw.close()


def test_a_flood_of_unknown_names_shares_one_fetch_and_reads_no_key(tmp_path):
    """Calls naming endpoints the copy does not know, all at once (made-up names and one created
    since the copy): they share the fetches, one at a time, with no point read of the store per
    call, and the new endpoint answers."""
    import pytest

    from common.errors import NotFound

    raw = SqliteStore(tmp_path / "f.db")
    fleet(raw, endpoints=1)
    store = CountingStore(raw)
    cache = UpstreamCache(store, ttl_secs=3600.0)
    fetches, running = [], []
    fetch = cache.mirror.fetch

    def counted():
        running.append(1)
        fetches.append(len(running))  # how many ran at once, this one included
        try:
            return fetch()
        finally:
            running.pop()

    cache.mirror.fetch = counted  # type: ignore[method-assign]

    async def view(name):
        return await cache.view(name)

    asyncio.run(view("e0"))
    gets = store.calls.get("get", 0)
    raw.put(keyspace.endpoints("new"), InferenceEndpoint(name="new", deployment="d0",
                                                         status=EndpointStatus()).model_dump_json())
    publish_plans(raw)
    before = len(fetches)

    async def flood():
        return await asyncio.gather(view("new"), *(view(f"made-up-{i}") for i in range(50)),
                                    return_exceptions=True)

    got = asyncio.run(flood())
    # the first caller's fetch, then one more that every later caller shares: they arrived while
    # the first ran, so only a fetch started after them counts (a fetch per caller would be 51)
    assert len(fetches) - before == 2 and max(fetches) == 1
    assert store.calls.get("get", 0) == gets  # no read of the store per name
    assert [r.replica_id for r in got[0].replicas] == ["d0-0", "d0-1", "d0-2", "d0-3"]
    assert all(isinstance(g, NotFound) for g in got[1:])
    assert set(cache._views) == {"e0", "new"}  # the made-up names are not kept
    with pytest.raises(NotFound):  # nothing written since: the next made-up name fetches nothing new
        asyncio.run(view("made-up-again"))
    cache.close()
    raw.close()


def test_a_call_arriving_as_a_fetch_finishes_waits_for_its_apply_and_does_not_spin(tmp_path):
    """The window between the fetch's result reaching the event loop and the copy being applied:
    a call that runs in it (a made-up name, so it waits for a fetch applied after it arrived)
    must wait for that apply, not find a finished fetch and ask again without yielding -- which
    spun the gateway's event loop forever under load (every call then timed out)."""
    import threading

    from common.errors import NotFound

    raw = SqliteStore(tmp_path / "f.db")
    fleet(raw, endpoints=1)
    cache = UpstreamCache(raw, ttl_secs=3600.0)
    release = threading.Event()
    fetch = cache.mirror.fetch

    def held():
        release.wait(10)
        return fetch()

    cache.mirror.fetch = held  # type: ignore[method-assign]
    results: list[object] = []

    async def scenario():
        first = asyncio.ensure_future(cache.view("e0"))  # starts the first fetch and waits for it
        await asyncio.sleep(0.05)
        release.set()
        time.sleep(0.3)  # blocks the loop: the fetch ends and its result is queued on the loop
        # this call's first step is queued after the fetch's result, so it runs before anything
        # the result schedules when the loop takes it
        late = asyncio.ensure_future(cache.view("made-up"))
        results.append((await first).endpoint.name)
        try:
            await late
        except NotFound as exc:
            results.append(exc.code)

    runner = threading.Thread(target=asyncio.run, args=(scenario(),), daemon=True)
    runner.start()
    runner.join(20)
    assert not runner.is_alive(), "the event loop spun in UpstreamCache._caught_up"
    assert results == ["e0", "endpoint_not_found"]
    cache.close()
    raw.close()


def test_readings_come_from_the_stream_and_are_confirmed_every_tenth_refresh(tmp_path):
    """Between confirmations a refresh takes the readings from the gateway's stream alone (no
    read of the observations); once READINGS_CONFIRM_EVERY TTLs passed it asks the store for them
    again, and readings_age (fabric_gateway_readings_age_seconds) says how long ago that was."""
    from gateway.upstreams import READINGS_CONFIRM_EVERY
    from lab.rigs.polling import wait_for

    raw = SqliteStore(tmp_path / "f.db")
    fleet(raw, endpoints=1)
    store, clock = CountingStore(raw), [0.0]
    cache = UpstreamCache(store, ttl_secs=1.0, clock=lambda: clock[0])
    span = keyspace.observations()

    def refresh(queue: int) -> tuple[int, int]:
        """A report moves d0-1's queue, reaches the stream, and a refresh follows one TTL later:
        (changed_since calls it made, the view's queue for d0-1)."""
        rev = raw.put(keyspace.observations("d0-1"), ReplicaObservation(
            replica_id="d0-1", scraped_at=time.time(), ok=True, queue_depth=queue).model_dump_json())
        wait_for(lambda: (cache.mirror.stream_reached(span) or 0) >= rev, 10, what="the stream", interval=0.02)
        raw.put(keyspace.nodes("n"), raw.get(keyspace.nodes("n")).value)  # a heartbeat moves the revision too
        asked = store.calls.get("changed_since", 0)
        clock[0] += 1.0
        view = asyncio.run(cache.view("e0"))
        return store.calls.get("changed_since", 0) - asked, view.readings["d0-1"].queue

    try:
        assert cache.readings_age() is None
        asyncio.run(cache.view("e0"))  # lists every prefix: the readings confirmed at clock 0
        assert cache.readings_age() == 0.0
        wait_for(lambda: cache.mirror.stream_reached(span) is not None, 10, what="the stream open", interval=0.02)
        per_refresh = [refresh(q) for q in range(1, READINGS_CONFIRM_EVERY + 1)]
        # every refresh saw its report; the last, READINGS_CONFIRM_EVERY TTLs on, asked for the
        # readings too: one changed_since more than the others
        assert [q for _, q in per_refresh] == list(range(1, READINGS_CONFIRM_EVERY + 1))
        asks = [n for n, _ in per_refresh]
        assert len(set(asks[:-1])) == 1 and asks[-1] == asks[0] + 1, asks
        assert cache.readings_age() == 0.0
        clock[0] += 3.0
        assert cache.readings_age() == 3.0
    finally:
        cache.close()
        raw.close()
