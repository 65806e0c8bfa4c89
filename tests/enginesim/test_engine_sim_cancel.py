"""Two queued requests cancelled in the same tick as the one running ahead of them."""

from __future__ import annotations

import asyncio

from enginesim.scheduler import SeqScheduler


def test_cancelling_running_and_queued_requests_together_leaves_a_clean_queue():
    async def scenario() -> int:
        sched = SeqScheduler(max_num_seqs=1)

        async def one() -> None:
            seq = await sched.admit(10)
            try:
                await asyncio.sleep(10)
            finally:
                sched.finish(seq)

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results), results
        seq = await asyncio.wait_for(sched.admit(5), 1)  # the slot is free again
        sched.finish(seq)
        return sched.snapshot().waiting

    assert asyncio.run(scenario()) == 0
