"""The crash-loop rule: replica failures counted per deployment across replacements (pure).

A failure is a replica that had to go because it was broken, not because it was asked to:
health failed three times in a row, it never became Ready within the start budget, it never
got an address within that budget, its engine exited (the reason is the engine's own last
error line), its model job failed, or the agent refused to create it. Scale-in, rollouts,
deletion and offline nodes are not failures.

The count lives in the deployment's status (``failures``, ``last_failure``,
``last_failure_at``), so a restart of fabricd or a new leader keeps it. After the n-th failure
the next replacement waits ``backoff_s(n)``: nothing after the first failure (one bad replica is
replaced at once), then base * 2^(n-2), capped (10, 20, 40 ... 300 s by default); at ``park_after`` failures the deployment is parked in phase ``CrashLoop``: no new
replica is created (the ready ones keep serving) until ``fabricctl ai deployment restart NAME``
(POST /api/ai/deployments/{name}/restart) zeroes the count. A replica Ready for ``reset_after_s``
zeroes the count too: the deployment recovered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.schemas import DeploymentStatus, Replica

CRASHLOOP_PHASE = "CrashLoop"
BACKOFF_PHASE = "Backoff"


@dataclass(frozen=True)
class CrashLoopSettings:
    park_after: int = 5
    backoff_base_s: float = 10.0
    backoff_cap_s: float = 300.0
    reset_after_s: float = 600.0


def backoff_s(failures: int, settings: CrashLoopSettings) -> float:
    if failures <= 1:
        return 0.0
    return min(settings.backoff_cap_s, settings.backoff_base_s * 2 ** min(failures - 2, 32))


@dataclass(frozen=True)
class CrashState:
    """What the deployment's status says after this tick's failures."""

    failures: int
    last_failure: str
    last_failure_at: float | None
    parked: bool
    wait_until: float | None  # no replacement before this (backoff); None: may create now

    def message(self, name: str, now: float) -> str:
        last = f"last failure: {self.last_failure}"
        if self.parked:
            return (f"parked after {self.failures} replica failures ({last}); "
                    f"`fabricctl ai deployment restart {name}` tries again")
        if self.wait_until is not None:
            return (f"backing off after {self.failures} replica failure{'s' if self.failures != 1 else ''}: "
                    f"next replica in {max(0.0, self.wait_until - now):.0f}s ({last})")
        return ""


def crash_state(status: DeploymentStatus, new_failures: Sequence[str], replicas: Sequence[Replica], now: float,
                settings: CrashLoopSettings) -> CrashState:
    failures, last, at = status.failures, status.last_failure, status.last_failure_at
    if new_failures:
        failures, last, at = failures + len(new_failures), new_failures[-1], now
    elif failures and any(r.ready and not r.draining and r.ready_since is not None
                          and now - r.ready_since >= settings.reset_after_s
                          and (at is None or r.ready_since > at) for r in replicas):
        return CrashState(0, last, at, False, None)  # a replica made after the last failure held up
    if failures >= settings.park_after:
        return CrashState(failures, last, at, True, None)
    until = (at or now) + backoff_s(failures, settings) if failures else None
    return CrashState(failures, last, at, False, until if until is not None and until > now else None)
