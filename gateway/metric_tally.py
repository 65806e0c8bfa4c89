"""Per-call metric updates as plain arithmetic on the event loop, folded into prometheus_client.

A proxied call made eight prometheus_client updates (requests, latency histogram sum and bucket,
TTFT sum and bucket, in-flight up and down, tokens), each taking the value's threading.Lock and
checking observability: measured ~5% of the gateway's samples at 64 clients. The hot-path
metrics (gateway.metrics: requests, tokens, TTFT, latency, in flight) are instead tallied here
in plain Python -- a float add, a bisect into the buckets -- and folded into the real children
before every scrape (``GatewayMetrics.exposition``) and at most FOLD_SECS after any update (a
timer armed by the first update after a fold, none while idle). With several workers
(multiprocess mode: a scrape answered by one worker reads every worker's values from their
files) GatewayMetrics updates the children directly instead, so a scrape never misses another
worker's last second.

Only the event loop's thread updates these (the app's calls); folding runs there too. The
exposition is the same text prometheus_client would have written for the same observations:
tests/gateway/test_metric_tally.py compares the two.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left

FOLD_SECS = 1.0


class Tally:
    """The pending updates of every tallied child; fold() moves them into the children."""

    def __init__(self) -> None:
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self.armed = False

    def counter(self, child) -> PendingCount:
        return self._add(PendingCount(child, self))

    def histogram(self, child) -> PendingHistogram:
        return self._add(PendingHistogram(child, self))

    def _add(self, pending):
        self._pending.append(pending)
        return pending

    def arm(self) -> None:
        """Called by the first update after a fold: fold within FOLD_SECS."""
        self.armed = True
        try:
            self._timer = asyncio.get_running_loop().call_later(FOLD_SECS, self.fold)
        except RuntimeError:  # no event loop (a unit test, a CLI command): fold at once
            self.fold()

    def fold(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.armed = False
        for pending in self._pending:
            pending.fold()


class _Pending:
    __slots__ = ("child", "tally")

    def __init__(self, child, tally: Tally) -> None:
        self.child = child
        self.tally = tally

    def fold(self) -> None:
        raise NotImplementedError


class PendingCount(_Pending):
    """A Counter or Gauge child: inc/dec add to a delta folded with child.inc (a gauge's delta
    may be negative; a counter's never is, as its inc refuses)."""

    __slots__ = ("delta",)

    def __init__(self, child, tally: Tally) -> None:
        super().__init__(child, tally)
        self.delta = 0.0

    def inc(self, amount: float = 1) -> None:
        self.delta += amount
        if not self.tally.armed:
            self.tally.arm()

    def dec(self, amount: float = 1) -> None:
        self.delta -= amount
        if not self.tally.armed:
            self.tally.arm()

    def fold(self) -> None:
        delta, self.delta = self.delta, 0.0
        if delta:
            self.child.inc(delta)


class PendingHistogram(_Pending):
    """A Histogram child: the bucket an observation falls in (the first upper bound >= it, as
    Histogram.observe picks) and the sum, folded into the child's bucket and sum values."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, child, tally: Tally) -> None:
        super().__init__(child, tally)
        self.bounds = list(child._upper_bounds)  # ends with +Inf: every observation has a bucket
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount
        if not self.tally.armed:
            self.tally.arm()

    def fold(self) -> None:
        counts, self.counts = self.counts, [0] * len(self.bounds)
        total, self.sum = self.sum, 0.0
        if not any(counts):
            return
        child = self.child
        child._sum.inc(total)
        for value, n in zip(child._buckets, counts):
            if n:
                value.inc(n)
