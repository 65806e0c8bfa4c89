"""Per-call deadlines without a timer per call: one sweep every TICK seconds while calls are timed.

``asyncio.timeout`` schedules and cancels an event-loop timer for every call and runs two
coroutines around it: ~4-8 µs a call under uvloop, ~3% of the gateway's CPU per proxied call at
64 clients. Here a call's deadline is a dict entry; one timer, armed only while some call is
timed, sweeps every TICK seconds and cancels the task of each call past its deadline; leaving the
``with`` block turns that cancellation into TimeoutError, as asyncio.timeout does (and, like it,
leaves any other cancellation alone). A deadline fires up to TICK late: deadlines are whole
seconds (FABRIC_GATEWAY_TOTAL_DEADLINE, x-request-timeout 1-300 s).
"""

from __future__ import annotations

import asyncio
import time

from common.task_cancel import cancelling, uncancel

TICK = 0.05  # seconds between sweeps while calls are timed


class Deadlines:
    """The timed calls of one event loop."""

    def __init__(self) -> None:
        self._calls: dict[Deadline, None] = {}  # insertion-ordered set
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the timer and calls are on

    def after(self, secs: float, task: asyncio.Task | None = None) -> Deadline:
        """``with deadlines.after(secs):`` inside a task: TimeoutError if the block is still
        running secs (up to TICK more) from now. task: the task running the block when the
        caller knows it (the server's cycle does), else asyncio.current_task() (which costs a
        getpid() syscall under Python 3.11)."""
        return Deadline(self, secs, task)

    def _sweep(self) -> None:
        now = time.monotonic()
        for d in [d for d in self._calls if d.when <= now]:
            del self._calls[d]
            d.expired = True
            d.task.cancel()
        self._timer = asyncio.get_running_loop().call_later(TICK, self._sweep) if self._calls else None

    @property
    def timed(self) -> int:
        return len(self._calls)


class Deadline:
    __slots__ = ("cancelling", "expired", "owner", "secs", "task", "when")

    def __init__(self, owner: Deadlines, secs: float, task: asyncio.Task | None = None) -> None:
        self.owner = owner
        self.secs = secs
        self.expired = False
        self.task = task

    def __enter__(self) -> Deadline:
        task = self.task or asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline is entered inside a task")
        self.task = task
        self.cancelling = cancelling(task)
        self.when = time.monotonic() + self.secs
        owner = self.owner
        loop = task.get_loop()
        if owner._loop is not loop:
            # Another loop than the last one (an app served again after its loop ended, as in
            # tests): that loop's timer and calls died with it, and a stale timer must not
            # keep this loop's calls from being swept.
            owner._loop, owner._timer = loop, None
            owner._calls.clear()
        owner._calls[self] = None
        if owner._timer is None:
            owner._timer = loop.call_later(TICK, owner._sweep)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.expired:
            self.owner._calls.pop(self, None)
            return
        # The sweep cancelled this task: undo that cancellation, and if nothing else asked for
        # one, the block timed out (asyncio.timeout's rule).
        if uncancel(self.task) <= self.cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
