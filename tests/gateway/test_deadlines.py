"""gateway.deadlines: a timed block past its deadline raises TimeoutError (asyncio.timeout's
rule), other cancellations pass through untouched, and no timer runs while nothing is timed."""

import asyncio

import pytest

from gateway.deadlines import Deadlines


def test_a_block_past_its_deadline_times_out_and_others_finish():
    async def main():
        d = Deadlines()

        async def call(secs, work, handed=False):
            # handed: the task is given (as the server's cycle gives it), not looked up
            with d.after(secs, asyncio.current_task() if handed else None):
                await asyncio.sleep(work)
            return "done"

        results = await asyncio.gather(call(0.05, 5), call(5, 0.01), call(0.05, 5, handed=True),
                                       return_exceptions=True)
        assert isinstance(results[0], TimeoutError) and isinstance(results[2], TimeoutError)
        assert results[1] == "done"
        assert d.timed == 0
        await asyncio.sleep(0.2)
        assert d._timer is None  # idle: no sweep scheduled

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    async def main():
        d = Deadlines()

        async def call():
            with d.after(30):
                await asyncio.sleep(30)

        task = asyncio.create_task(call())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert d.timed == 0

    asyncio.run(main())


def test_a_task_cancelled_while_it_times_out_is_still_cancelled():
    """asyncio.timeout's rule: when another cancellation is pending, the block does not turn it
    into TimeoutError."""
    async def main():
        d = Deadlines()
        entered = asyncio.Event()

        async def call():
            with d.after(0.01):
                entered.set()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    asyncio.current_task().cancel()  # a second cancellation, as a client leaving would
                    raise

        task = asyncio.create_task(call())
        await entered.wait()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 10))


def test_entering_outside_a_task_is_an_error():
    with pytest.raises(RuntimeError):
        Deadlines().after(1).__enter__()


def test_a_timer_left_by_an_ended_loop_does_not_stop_the_next_loops_deadlines():
    """The app's Deadlines outlives an event loop that ends with its sweep still scheduled (a
    call finished just before the loop closed); the next loop's calls still time out."""
    d = Deadlines()

    async def quick():
        with d.after(5):
            await asyncio.sleep(0)

    asyncio.run(quick())
    assert d._timer is not None  # the ended loop's sweep never ran

    async def slow():
        deadline = d.after(0.05)
        try:
            with deadline:
                await asyncio.sleep(5)
        except TimeoutError:
            return deadline.expired  # the sweep cut it, not the guard below
        return False

    assert asyncio.run(asyncio.wait_for(slow(), 3)) is True
