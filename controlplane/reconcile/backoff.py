"""Retry backoff for agents that cannot be reached, one schedule per node.

When a call to a node's agent fails with a TransientError (unreachable, timeout, 5xx), the
reconciler stops calling that agent until the node's next try: the n-th failure in a row waits
``backoff_delay(n)`` = 1, 2, 4, 8, 16, 32, then 60 s for every later one (capped). The first
successful call resets the node. While a node waits, every deployment that needs its agent
stays Pending with a message naming the agent, how many tries failed, the last error and when
the next try is; the message changes only when a try fails, so it does not churn the status.

The schedule and transitions are pure functions of plain data (``backoff_delay``,
``after_failure``, ``is_due``); ``AgentBackoff`` is the small table the reconciler keeps in
memory. Losing it (a fabricd restart) only means the next pass tries every agent at once.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import FabricError, TransientError

BASE_DELAY_S = 1.0
MAX_DELAY_S = 60.0


def backoff_delay(failures: int, *, base: float = BASE_DELAY_S, cap: float = MAX_DELAY_S) -> float:
    """Seconds to wait after the ``failures``-th consecutive failure (0 failures: no wait)."""
    if failures <= 0:
        return 0.0
    # Stop doubling once past the cap: 2**failures would overflow a float after ~1000 failures.
    exponent = min(failures - 1, 32)
    return min(cap, base * (2 ** exponent))


def _clock_text(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%H:%M:%SZ")


@dataclass(frozen=True)
class AgentRetry:
    """Where one node's agent stands: consecutive failures, the last error, the next try."""

    node: str
    failures: int
    delay_s: float
    next_try_at: float  # wall-clock seconds
    last_error: str

    @property
    def message(self) -> str:
        tries = "1 try" if self.failures == 1 else f"{self.failures} tries in a row"
        return (f"agent on {self.node} unreachable ({tries} failed, last: {self.last_error}); "
                f"next try at {_clock_text(self.next_try_at)} (backoff {self.delay_s:g}s)")


def after_failure(previous: AgentRetry | None, node: str, error: str, now: float, *,
                  base: float = BASE_DELAY_S, cap: float = MAX_DELAY_S) -> AgentRetry:
    failures = (previous.failures if previous is not None else 0) + 1
    delay = backoff_delay(failures, base=base, cap=cap)
    return AgentRetry(node, failures, delay, now + delay, error)


def is_due(retry: AgentRetry | None, now: float) -> bool:
    """True when the agent may be called now (never failed, or its wait is over)."""
    return retry is None or now >= retry.next_try_at


class AgentBackoff:
    """The per-node table (in memory, one event-loop thread)."""

    def __init__(self, clock: Callable[[], float] = time.time, *, base: float = BASE_DELAY_S,
                 cap: float = MAX_DELAY_S):
        self.clock, self.base, self.cap = clock, base, cap
        self._retries: dict[str, AgentRetry] = {}

    def waiting(self, node: str) -> AgentRetry | None:
        """The node's retry state while its agent must not be called yet, else None."""
        retry = self._retries.get(node)
        return None if is_due(retry, self.clock()) else retry

    def failed(self, node: str, error: str) -> AgentRetry:
        retry = after_failure(self._retries.get(node), node, error, self.clock(), base=self.base, cap=self.cap)
        self._retries[node] = retry
        return retry

    def succeeded(self, node: str) -> None:
        self._retries.pop(node, None)

    def get(self, node: str) -> AgentRetry | None:
        return self._retries.get(node)

    def next_try_at(self) -> float | None:
        """The earliest retry still ahead (wall clock), None when no node is waiting. A node
        whose wait is over but that nothing needed since does not count (no busy loop)."""
        now = self.clock()
        return min((r.next_try_at for r in self._retries.values() if r.next_try_at > now), default=None)


class BackoffAgent:
    """An agent client that honours and feeds the node's backoff.

    While the node waits, every call raises TransientError with the retry message (the agent is
    not contacted). A TransientError from the agent counts a failure and is re-raised with the
    retry message; any answer (also a 4xx, which is the agent speaking) resets the node."""

    def __init__(self, client, node: str, backoff: AgentBackoff):
        self._client, self._node, self._backoff = client, node, backoff

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        async def call(*args, **kwargs):
            retry = self._backoff.waiting(self._node)
            if retry is not None:
                raise TransientError(retry.message, code="agent_backoff")
            try:
                result = await attr(*args, **kwargs)
            except TransientError as exc:
                raise TransientError(self._backoff.failed(self._node, exc.message).message,
                                     code="agent_unreachable") from exc
            except FabricError:
                self._backoff.succeeded(self._node)
                raise
            self._backoff.succeeded(self._node)
            return result

        return call
