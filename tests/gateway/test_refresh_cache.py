"""gateway.refresh_cache: one store read per key however many calls ask, the last value served
while it reloads, nothing stale after a failed reload."""

import asyncio
import threading

import pytest

from gateway.refresh_cache import RefreshCache


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Loader:
    """A blocking store read the test releases: counts its calls, returns the next value."""

    def __init__(self):
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self):
        self.calls += 1
        n = self.calls
        self.gate.wait(5)
        if self.fail:
            raise RuntimeError("store down")
        return f"v{n}"


def run(coro):
    return asyncio.run(coro)


def test_sixty_four_concurrent_misses_make_one_load():
    async def go():
        cache, load = RefreshCache(1.0), Loader()
        load.gate.clear()
        waiters = [asyncio.create_task(cache.get("k", load)) for _ in range(64)]
        await asyncio.sleep(0.05)
        load.gate.set()
        return await asyncio.gather(*waiters), load.calls, cache.loads
    values, calls, loads = run(go())
    assert values == ["v1"] * 64
    assert (calls, loads) == (1, 1)


def test_past_half_the_ttl_one_background_reload_replaces_the_value_before_it_expires():
    async def go():
        clock = Clock()
        cache, load = RefreshCache(1.0, clock=clock), Loader()
        assert await cache.get("k", load) == "v1"
        clock.now += 0.3
        assert await cache.get("k", load) == "v1" and load.calls == 1  # young: no load
        clock.now += 0.4  # past half the TTL, not expired
        load.gate.clear()
        served = [await cache.get("k", load) for _ in range(10)]  # none of these waits for the store
        await asyncio.sleep(0.05)
        started = load.calls
        load.gate.set()
        await asyncio.sleep(0.05)
        return served, started, await cache.get("k", load), load.calls
    served, started, after, calls = run(go())
    assert served == ["v1"] * 10
    assert started == 2  # one background reload for the ten calls
    assert after == "v2" and calls == 2


def test_an_expired_value_is_never_served():
    async def go():
        clock = Clock()
        cache, load = RefreshCache(1.0, clock=clock), Loader()
        await cache.get("k", load)
        clock.now += 1.0
        return await cache.get("k", load)
    assert run(go()) == "v2"


def test_a_failed_load_reaches_every_waiter_and_the_next_call_loads_again():
    async def go():
        clock = Clock()
        cache, load = RefreshCache(1.0, clock=clock), Loader()
        await cache.get("k", load)
        clock.now += 0.6
        load.fail = True
        assert await cache.get("k", load) == "v1"  # still fresh while the reload fails
        await asyncio.sleep(0.05)
        assert await cache.get("k", load) == "v1"  # a failed reload leaves the fresh value...
        clock.now += 0.5  # ...until it expires
        await asyncio.sleep(0.05)
        results = await asyncio.gather(cache.get("k", load), cache.get("k", load), return_exceptions=True)
        load.fail = False
        return results, load.calls, await cache.get("k", load)
    results, calls, recovered = run(go())
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert calls == 4  # two failed background reloads, then one load shared by both waiters
    assert recovered == "v5"


def test_a_cancelled_caller_does_not_cancel_the_shared_load():
    async def go():
        cache, load = RefreshCache(1.0), Loader()
        load.gate.clear()
        first = asyncio.create_task(cache.get("k", load))
        second = asyncio.create_task(cache.get("k", load))
        await asyncio.sleep(0.02)
        first.cancel()
        load.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await first
        return await second, load.calls
    assert run(go()) == ("v1", 1)


def test_entries_are_bounded():
    async def go():
        cache, load = RefreshCache(1.0, max_entries=3), Loader()
        for k in range(10):
            await cache.get(k, load)
        return len(cache)
    assert run(go()) <= 3
