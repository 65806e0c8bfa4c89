"""Admission of sequences: at most max_num_seqs run, the rest wait in FIFO order.

A finished sequence hands its slot straight to the oldest waiter, so a newcomer can
never overtake the queue. Each running sequence reports how many tokens it holds
(prompt + generated so far); their sum is the KV-cache occupancy.

Single event loop only: no locks, all mutation happens between awaits.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Sequence:
    seq_id: int
    held_tokens: int = 0


@dataclass
class SchedulerSnapshot:
    running: int
    waiting: int
    held_tokens: int


@dataclass
class SeqScheduler:
    max_num_seqs: int
    _running: dict[int, Sequence] = field(default_factory=dict)
    _waiters: deque[asyncio.Future] = field(default_factory=deque)
    _ids: itertools.count = field(default_factory=itertools.count)
    # Waiters already handed a slot that have not woken up yet; counting them keeps
    # a newcomer from taking the same slot in between.
    _granted: int = 0

    async def admit(self, prompt_tokens: int) -> Sequence:
        """Wait for a slot (FIFO) and return the running sequence.

        The caller must call `finish` exactly once, also when it is cancelled
        after admission; a waiter that is cancelled leaves the queue by itself.
        """
        if self._free_slots() > 0 and not self._waiters:
            return self._start(prompt_tokens)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Granted a slot in the same tick we were cancelled: pass it on.
                self._granted -= 1
                self._grant_next()
            elif waiter in self._waiters:
                # finish() may already have dropped it when both were cancelled in one tick.
                self._waiters.remove(waiter)
            raise
        self._granted -= 1
        return self._start(prompt_tokens)

    def finish(self, seq: Sequence) -> None:
        if self._running.pop(seq.seq_id, None) is not None:
            self._grant_next()

    def snapshot(self) -> SchedulerSnapshot:
        return SchedulerSnapshot(
            running=len(self._running) + self._granted,
            waiting=len(self._waiters),
            held_tokens=sum(s.held_tokens for s in self._running.values()),
        )

    def _start(self, prompt_tokens: int) -> Sequence:
        seq = Sequence(seq_id=next(self._ids), held_tokens=prompt_tokens)
        self._running[seq.seq_id] = seq
        return seq

    def _free_slots(self) -> int:
        return self.max_num_seqs - len(self._running) - self._granted

    def _grant_next(self) -> None:
        while self._free_slots() > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._granted += 1
