"""Password logins off fabricd's shared thread pool, bounded, and slowed down for guessers.

A password check costs an Argon2id hash (64 MiB, tens of milliseconds) whether the name exists
or not. Logins used to wait for it in the thread pool that also serves every synchronous route
(node heartbeats and /healthz included): 150 concurrent logins stalled them all. Now:

  - checks run on a small executor of their own (HASH_WORKERS threads); the route awaits it, so
    a waiting login holds no thread of the shared pool;
  - at most MAX_WAITING logins are queued or running at once; one more is answered 429
    "login_busy" with Retry-After at once, before any hash;
  - after FREE_FAILURES wrong passwords for one account, or SOURCE_FREE_FAILURES from one source
    address (several people may share one), within FAILURE_WINDOW_S, further logins for it are
    429 "login_backoff" for a delay that doubles with
    each further failure (BASE_DELAY_S up to MAX_DELAY_S), without a hash. A success clears the
    account's count (not the source's). Counts live in this process's memory: several fabricd
    processes each keep their own, so a guesser gains at most a factor of their number.

``LoginGate.check(account, source, verify)`` is the one door: the console and the API call it.
The pure decision is ``Failures.delay``; the tables are bounded (oldest entries go first).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from common.errors import LimitExceeded

HASH_WORKERS = 2
MAX_WAITING = 16
FREE_FAILURES = 5
SOURCE_FREE_FAILURES = 20
FAILURE_WINDOW_S = 15 * 60.0
BASE_DELAY_S = 1.0
MAX_DELAY_S = 300.0
MAX_TRACKED = 10_000

T = TypeVar("T")


@dataclass
class _Record:
    count: int
    last: float


@dataclass
class Failures:
    """Failed logins per name (an account or a source address), oldest dropped past MAX_TRACKED."""

    free: int = FREE_FAILURES
    window_s: float = FAILURE_WINDOW_S
    limit: int = MAX_TRACKED
    _seen: OrderedDict = field(default_factory=OrderedDict)

    def delay(self, name: str, now: float) -> float:
        """Seconds ``name`` must still wait before its next try (0: it may try now)."""
        rec = self._seen.get(name)
        if rec is None or now - rec.last > self.window_s:
            return 0.0
        over = rec.count - self.free
        if over < 0:
            return 0.0
        wait = min(MAX_DELAY_S, BASE_DELAY_S * (2 ** min(over, 16)))
        return max(0.0, rec.last + wait - now)

    def failed(self, name: str, now: float) -> None:
        rec = self._seen.pop(name, None)
        if rec is None or now - rec.last > self.window_s:
            rec = _Record(0, now)
        rec.count, rec.last = rec.count + 1, now
        self._seen[name] = rec
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def clear(self, name: str) -> None:
        self._seen.pop(name, None)


class LoginGate:
    def __init__(self, workers: int = HASH_WORKERS, max_waiting: int = MAX_WAITING,
                 clock: Callable[[], float] = time.monotonic):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fabricd-login")
        self._max_waiting = max_waiting
        self._waiting = 0
        self._lock = threading.Lock()  # the tables are touched from the loop and from sync tests
        self._clock = clock
        self.accounts = Failures()
        self.sources = Failures(free=SOURCE_FREE_FAILURES)

    def _refuse_backoff(self, account: str, source: str, now: float) -> None:
        wait = max(self.accounts.delay(account, now), self.sources.delay(source, now))
        if wait > 0:
            raise LimitExceeded("too many failed logins for this account or from this address; wait and try again",
                                retry_after=wait, code="login_backoff")

    async def check(self, account: str, source: str, verify: Callable[[], T]) -> T:
        """``verify()`` (the password check, raising on a wrong password) run on the gate's
        executor; 429 when the queue is full or the account or source is backing off."""
        account, source = account[:256], source or "unknown"
        with self._lock:
            self._refuse_backoff(account, source, self._clock())
            if self._waiting >= self._max_waiting:
                raise LimitExceeded("fabricd is busy checking other logins; try again in a moment",
                                    retry_after=1.0, code="login_busy")
            self._waiting += 1
        try:
            result = await asyncio.get_running_loop().run_in_executor(self._pool, verify)
        except Exception:
            with self._lock:
                now = self._clock()
                self.accounts.failed(account, now)
                self.sources.failed(source, now)
            raise
        finally:
            with self._lock:
                self._waiting -= 1
        with self._lock:
            self.accounts.clear(account)
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
