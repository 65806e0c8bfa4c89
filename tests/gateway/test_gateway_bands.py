"""Priority bands (gateway.bands): the displacement order as a table, TTL, release order, and the
waiting room applying them (asyncio, no network)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.bands import Queued, QueuePolicy, QueueRefused, WaitingRoom, expired, plan_enqueue, release_order
from lab.rigs.polling import wait_for_async


def q(spec: str) -> list[Queued]:
    """'low:a normal:b' -> queued calls in that arrival order."""
    out = []
    for i, item in enumerate(spec.split()):
        band, rid = item.split(":")
        out.append(Queued(rid, band, float(i)))
    return out


POLICY = QueuePolicy(per_band=3, total=4, ttl=10.0)


@pytest.mark.parametrize("queued, band, admitted, displaced", [
    ("", "low", True, None),
    ("low:a low:b normal:c", "high", True, None),  # under the total: nobody displaced
    ("low:a low:b normal:c high:d", "high", True, "b"),  # the newest of the lowest band
    ("low:a normal:b low:c high:d", "normal", True, "c"),  # newest low even though it arrived later
    ("normal:a normal:b low:c high:d", "high", True, "c"),  # the lowest band first, whatever its age
    ("normal:a normal:b high:c high:d", "high", True, "b"),  # no low: the newest normal
    ("normal:a normal:b high:c high:d", "normal", False, None),  # never displaces its own band
    ("low:a low:b low:c normal:d", "low", False, None),  # band full
    ("high:a high:b normal:c normal:d", "low", False, None),  # nothing lower to displace
    ("high:a high:b high:c normal:d", "high", False, None),  # its band holds per_band
])
def test_displacement_order(queued, band, admitted, displaced):
    d = plan_enqueue(q(queued), band, POLICY)
    assert d.admitted is admitted
    assert (d.displaced.request_id if d.displaced else None) == displaced


def test_a_higher_band_is_never_refused_while_a_lower_one_waits():
    waiting = q("low:a low:b low:c normal:d")
    for i in range(3):  # each high call displaces the newest low until none is left
        d = plan_enqueue(waiting, "high", QueuePolicy(per_band=4, total=4))
        assert d.admitted and d.displaced.band == "low"
        waiting = [w for w in waiting if w is not d.displaced] + [Queued(f"h{i}", "high", 10.0 + i)]
    assert [w.request_id for w in waiting] == ["d", "h0", "h1", "h2"]
    assert plan_enqueue(waiting, "high", QueuePolicy(per_band=4, total=4)).displaced.request_id == "d"


def test_ttl_and_release_order():
    waiting = q("low:a normal:b high:c low:d high:e")
    assert [w.request_id for w in release_order(waiting)] == ["c", "e", "b", "a", "d"]
    assert [w.request_id for w in expired(waiting, QueuePolicy(ttl=2.5), now=4.0)] == ["a", "b"]


def test_waiting_room_displaces_times_out_and_releases():
    async def scenario():
        room_open = False
        displaced: list[str] = []
        room = WaitingRoom(QueuePolicy(per_band=4, total=2, ttl=0.6), on_displaced=displaced.append)

        async def has_room():
            return room_open

        low = asyncio.create_task(room.wait("ep", "low", "l1", has_room))
        normal = asyncio.create_task(room.wait("ep", "normal", "n1", has_room))
        await asyncio.sleep(0.01)
        high = asyncio.create_task(room.wait("ep", "high", "h1", has_room))
        with pytest.raises(QueueRefused) as exc:
            await low
        assert exc.value.code == "displaced" and displaced == ["ep"]
        assert room.depth("ep") == {"low": 0, "normal": 1, "high": 1}
        with pytest.raises(QueueRefused) as refused:  # full, and low is the lowest band
            await room.wait("ep", "low", "l2", has_room)
        assert refused.value.code == "queue_full"
        room_open = True
        assert await high >= 0 and await normal >= 0
        room_open = False
        with pytest.raises(QueueRefused) as late:
            await room.wait("ep", "normal", "n2", has_room)
        assert late.value.code == "queue_timeout" and room.depth("ep")["normal"] == 0

    asyncio.run(scenario())


def test_policy_share_divides_the_fleet_bounds():
    policy = QueuePolicy(per_band=64, total=128)
    assert policy.share(1) is policy
    assert (policy.share(3).per_band, policy.share(3).total) == (21, 42)
    assert (QueuePolicy(per_band=2, total=3).share(5).per_band, QueuePolicy(per_band=2, total=3).share(5).total) == (1, 1)


def test_two_gateways_on_one_store_hold_the_total_between_them(tmp_path):
    """Two gateway instances assembled as fabric-gateway does (gateway.assemble.create_app) on one
    SQLite store: each holds its share of FABRIC_BAND_TOTAL, so the calls waiting at both never
    exceed it; displacement stays within the process; when one gateway's lease goes, the other
    takes the whole bound."""
    from common.store import open_store
    from gateway import settings as gateway_settings
    from gateway.assemble import create_app

    store = open_store(f"sqlite://{tmp_path}/fabric.db")
    env = {"FABRIC_SATURATION_QUEUE": "4", "FABRIC_BAND_QUEUE": "4", "FABRIC_BAND_TOTAL": "4",
           "FABRIC_BAND_TTL_SECS": "30"}
    apps = [create_app(gateway_settings.load(env), store, b"k" * 32, f"gw-{n}") for n in "ab"]
    rooms = [app.state.dispatcher.room for app in apps]
    holders = [app.state.limits.slots for app in apps]

    async def scenario():
        for h in holders:
            await asyncio.to_thread(h.register)

        async def closed():
            return False

        async def until(check):  # the rooms read the live gateways from the store in a thread
            await wait_for_async(check, 5, "the waiting rooms to reach the expected depths", interval=0.01)

        tasks = []
        for g, room in zip("ab", rooms):
            for i in range(2):  # one at a time: each call enqueues after a store read in a thread,
                # so calls started together enqueue in any order and "newest" would be chance
                tasks.append(asyncio.create_task(room.wait("ep", "low", f"{g}-l{i}", closed)))
                await until(lambda room=room, n=i + 1: room.depth("ep")["low"] == n)
        await until(lambda: [r.depth("ep")["low"] for r in rooms] == [2, 2])  # 4 of 4 across the two
        with pytest.raises(QueueRefused) as full:  # a's share (2) is full and nothing is lower
            await rooms[0].wait("ep", "low", "a-l3", closed)
        assert full.value.code == "queue_full" and "share of 4" in full.value.message
        tasks.append(asyncio.create_task(rooms[1].wait("ep", "high", "b-h1", closed)))  # displaces b's newest
        with pytest.raises(QueueRefused) as displaced:
            await tasks[3]
        assert displaced.value.code == "displaced"
        await until(lambda: rooms[1].depth("ep") == {"low": 1, "normal": 0, "high": 1})
        assert sum(sum(r.depth("ep").values()) for r in rooms) == 4  # never more than the total
        await asyncio.to_thread(holders[1].revoke)  # b is gone: a may hold the whole bound
        await asyncio.sleep(1.1)  # past the cached listing of live gateways
        tasks += [asyncio.create_task(rooms[0].wait("ep", "low", f"a-x{i}", closed)) for i in range(2)]
        await until(lambda: rooms[0].depth("ep")["low"] == 4)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        holders[0].revoke()
        store.close()
