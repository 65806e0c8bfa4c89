"""Saturation and pool spillover (pure).

A replica is saturated when a reading younger than MAX_READING_AGE says its queue is past the
healthy depth (FABRIC_SATURATION_QUEUE) or its KV cache use past the ceiling
(FABRIC_SATURATION_KV, 0-1). A replica without a fresh reading is not saturated (nothing says it
is). A pool (one deployment's ready replicas) is saturated when it has no replica or every one
is saturated. With neither setting a pool is saturated only when it has no ready replica.

An endpoint's pools, in preference order, are its ``deployment`` then its ``spillover``. A call
goes to the first pool that is not saturated; when all are, the preferred one is kept (and the
call may wait in its band, or leave for a fallback: gateway.dispatch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.schemas import Replica

MAX_READING_AGE = 30.0


@dataclass(frozen=True)
class Saturation:
    queue: float | None = None  # healthy queue depth; above it a replica is saturated
    kv: float | None = None  # KV cache use ceiling, 0-1

    @property
    def measured(self) -> bool:
        return self.queue is not None or self.kv is not None


@dataclass(frozen=True)
class Reading:
    queue: float
    kv: float
    at: float


def replica_saturated(reading: Reading | None, measure: Saturation, now: float) -> bool:
    if reading is None or now - reading.at >= MAX_READING_AGE:
        return False
    if measure.queue is not None and reading.queue > measure.queue:
        return True
    return measure.kv is not None and reading.kv > measure.kv


def pool_saturated(replicas: Sequence[Replica], readings: Mapping[str, Reading], measure: Saturation,
                   now: float) -> bool:
    if not replicas:
        return True
    if not measure.measured:
        return False
    return all(replica_saturated(readings.get(r.replica_id), measure, now) for r in replicas)


@dataclass(frozen=True)
class PoolChoice:
    index: int  # into the pools as given
    all_saturated: bool
    saturated: tuple[bool, ...]

    @property
    def spilled(self) -> bool:
        return self.index > 0


def choose_pool(pools: Sequence[Sequence[Replica]], readings: Mapping[str, Reading], measure: Saturation,
                now: float) -> PoolChoice:
    """The first pool that is not saturated; the preferred (first) one when all are."""
    flags = tuple(pool_saturated(p, readings, measure, now) for p in pools)
    for i, full in enumerate(flags):
        if not full:
            return PoolChoice(i, False, flags)
    return PoolChoice(0, True, flags)
