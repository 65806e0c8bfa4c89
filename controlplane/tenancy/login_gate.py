"""Password logins off fabricd's shared thread pool, bounded, and slowed down for guessers.

A password check costs an Argon2id hash (64 MiB, tens of milliseconds) whether the name exists
or not. Logins used to wait for it in the thread pool that also serves every synchronous route
(node heartbeats and /healthz included): 150 concurrent logins stalled them all. Now:

  - checks run on a small executor of their own (HASH_WORKERS threads); the route awaits it, so
    a waiting login holds no thread of the shared pool;
  - at most MAX_WAITING logins are queued or running at once; one more is answered 429
    "login_busy" with Retry-After at once, before any hash;
  - failures are counted three ways within FAILURE_WINDOW_S, and each count past its free
    allowance answers 429 "login_backoff" for a delay that doubles with each further failure
    (BASE_DELAY_S up to MAX_DELAY_S), without a hash:
      * per account AND source (FREE_FAILURES): a guesser at one address is slowed on that
        account, and only there;
      * per source (SOURCE_FREE_FAILURES; several people may share one address): one address
        guessing many accounts;
      * per account from everywhere (ACCOUNT_FREE_FAILURES): guessing spread over many
        addresses. This one never refuses a source that logged in to the account successfully
        before (the KNOWN_SOURCES last ones per account), so nobody can lock the real admin out
        by failing on purpose: an attacker's failures slow the attacker's own addresses, and the
        account-wide bound only slows addresses the account has never logged in from.
    A success clears its account-and-source count (not the source's or the account's).
  - Counts live in this process's memory: several fabricd processes each keep their own, so a
    guesser gains at most a factor of their number. An operator unlocks at once by restarting
    fabricd (`systemctl restart fabricd`: the counts start empty); otherwise they expire
    FAILURE_WINDOW_S after the last failure.

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
ACCOUNT_FREE_FAILURES = 100
KNOWN_SOURCES = 8
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


def _pair(account: str, source: str) -> str:
    return f"{account}\0{source}"


class LoginGate:
    def __init__(self, workers: int = HASH_WORKERS, max_waiting: int = MAX_WAITING,
                 clock: Callable[[], float] = time.monotonic):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fabricd-login")
        self._max_waiting = max_waiting
        self._waiting = 0
        self._lock = threading.Lock()  # the tables are touched from the loop and from sync tests
        self._clock = clock
        self.pairs = Failures()  # "account\0source"
        self.sources = Failures(free=SOURCE_FREE_FAILURES)
        self.accounts = Failures(free=ACCOUNT_FREE_FAILURES)
        self._known: OrderedDict[str, list[str]] = OrderedDict()  # account -> sources it logged in from

    def known_source(self, account: str, source: str) -> bool:
        return source in self._known.get(account, ())

    def _succeeded(self, account: str, source: str) -> None:
        self.pairs.clear(_pair(account, source))
        known = [s for s in self._known.pop(account, []) if s != source][-(KNOWN_SOURCES - 1):]
        self._known[account] = [*known, source]
        while len(self._known) > MAX_TRACKED:
            self._known.popitem(last=False)

    def _refuse_backoff(self, account: str, source: str, now: float) -> None:
        wait = max(self.pairs.delay(_pair(account, source), now), self.sources.delay(source, now),
                   0.0 if self.known_source(account, source) else self.accounts.delay(account, now))
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
                self.pairs.failed(_pair(account, source), now)
                self.sources.failed(source, now)
                self.accounts.failed(account, now)
            raise
        finally:
            with self._lock:
                self._waiting -= 1
        with self._lock:
            self._succeeded(account, source)
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
