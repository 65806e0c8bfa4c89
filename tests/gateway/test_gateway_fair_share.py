"""Fair shares between tenants inside one priority band (gateway.fair_share, gateway.bands): one
tenant sending 10x the tokens per call cannot starve another. Measured in queue positions (the
order calls leave the band), never in wall-clock time."""

from __future__ import annotations

import asyncio

from gateway.bands import Queued, QueuePolicy, WaitingRoom, release_order
from gateway.fair_share import FairClock

HEAVY, LIGHT = 1000, 100  # estimated tokens per call: prompt + max_tokens


def queue(clock: FairClock, calls: list[tuple[str, int]]) -> list[Queued]:
    out = []
    for i, (tenant, cost) in enumerate(calls):
        start, finish = clock.stamp(tenant, cost)
        out.append(Queued(f"{tenant}{i}", "normal", float(i), tenant, start, finish))
    return out


def test_release_order_shares_tokens_not_calls():
    # The heavy tenant queued all of its calls first: first come, first served would let all 20
    # of them go before the light tenant's first.
    waiting = queue(FairClock(), [("heavy", HEAVY)] * 20 + [("light", LIGHT)] * 20)
    order = [q.tenant for q in release_order(waiting)]
    assert order.index("light") <= 1
    tokens = {"heavy": 0, "light": 0}
    for tenant in order[:22]:  # while both have calls queued, their let-through tokens stay level
        tokens[tenant] += HEAVY if tenant == "heavy" else LIGHT
        assert abs(tokens["heavy"] - tokens["light"]) <= HEAVY + LIGHT
    # Each light call waits behind at most one heavy call more than the one before it.
    heavy_before = [order[:i].count("heavy") for i, t in enumerate(order) if t == "light"]
    assert max(b - a for a, b in zip(heavy_before, heavy_before[1:])) <= 1
    assert order[:22].count("light") >= 18  # ~10 light calls per heavy one


def test_bands_still_come_first_and_equal_tags_go_oldest_first():
    clock = FairClock()
    low = Queued("l", "low", 0.0, "a", *clock.stamp("a", 1))
    high = Queued("h", "high", 1.0, "a", 50.0, 60.0)
    same = queue(FairClock(), [("a", 10), ("b", 10)])
    assert [q.request_id for q in release_order([low, high, *same])] == ["h", "a0", "b1", "l"]


def test_a_withdrawn_call_gives_its_tokens_back():
    clock = FairClock()
    start, end = clock.stamp("heavy", HEAVY)
    clock.withdrawn("heavy", start, end)  # displaced or timed out before it ran
    assert clock.stamp("heavy", LIGHT)[0] == 0.0


def test_the_light_tenants_queue_wait_is_bounded_however_long_the_heavy_backlog():
    """Through the waiting room: the heavy tenant keeps 30 long calls queued; each short call of
    the other tenant leaves after at most one heavy call, in queue positions."""

    async def scenario() -> tuple[list[int], list[str]]:
        room = WaitingRoom(QueuePolicy(per_band=64, total=128, ttl=600, release_per_tick=1))
        budget = [0]
        released: list[str] = []

        async def has_room() -> bool:
            if budget[0] > 0:
                budget[0] -= 1
                return True
            return False

        async def call(request_id: str, tenant: str, cost: int) -> None:
            await room.wait("ep", "normal", request_id, has_room, tenant, cost)
            released.append(tenant)

        heavy = [asyncio.create_task(call(f"h{i}", "heavy", HEAVY)) for i in range(30)]
        await asyncio.sleep(0)
        waits = []
        for j in range(8):
            light = asyncio.create_task(call(f"l{j}", "light", LIGHT))
            await asyncio.sleep(0)
            before = len(released)
            while not light.done():
                budget[0] = 1
                while budget[0]:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0)
            waits.append(len(released) - before - 1)  # calls let go ahead of this one after it arrived
        for t in heavy:
            t.cancel()
        await asyncio.gather(*heavy, return_exceptions=True)
        return waits, released

    waits, released = asyncio.run(scenario())
    assert max(waits) <= 1
    assert released.count("light") == 8
    assert released.count("heavy") <= 9  # the light tenant got most of the turns, at a tenth of the tokens
