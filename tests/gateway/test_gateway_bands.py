"""Priority bands (gateway.bands): the displacement order as a table, TTL, release order, and the
waiting room applying them (asyncio, no network)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.bands import Queued, QueuePolicy, QueueRefused, WaitingRoom, expired, plan_enqueue, release_order


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
