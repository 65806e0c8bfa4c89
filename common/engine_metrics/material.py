"""Whether a new observation must replace the stored one (pure).

An observation is written, and an agent reports it, only when it differs materially from the
last one written: ok changed; the health probe's status changed; the queue, running count, missing readings or the stall mark
changed; KV usage moved by ``KV_TOLERANCE`` (0.005) or more; a rate moved by more than
``RATE_TOLERANCE`` (2 %) or appeared or disappeared. Otherwise it is written again only when the
stored one is ``REFRESH_AFTER_S`` (15 s, half the 30 s eligibility window) old, so readers of
the store (gateway shedding, explain, metrics) see every queue change and never a live replica's
observation past its eligibility window; a reporter that stops (a silent agent) lets it age out.
"""

from __future__ import annotations

from common.schemas import ReplicaObservation

MAX_SCRAPE_AGE_S = 30.0  # an observation older than this is stale: the replica gets no weight
REFRESH_AFTER_S = MAX_SCRAPE_AGE_S / 2
KV_TOLERANCE = 0.005
RATE_TOLERANCE = 0.02


def _rate_moved(old: float | None, new: float | None, tolerance: float) -> bool:
    if old is None or new is None:
        return old is not new
    return abs(new - old) > tolerance * max(abs(old), abs(new), 1e-9)


def material_change(stored: ReplicaObservation | None, new: ReplicaObservation,
                    refresh_after_s: float = REFRESH_AFTER_S) -> bool:
    """Whether ``new`` must be written over ``stored`` (see the module docstring)."""
    if stored is None or stored.ok != new.ok or new.scraped_at - stored.scraped_at >= refresh_after_s:
        return True
    if stored.health != new.health:
        return True  # the reconcile pass reads an agent's health probe from the stored observation
    if not new.ok:
        return False  # still failing: the first failure was written, the age refresh keeps it current
    return (
        stored.queue_depth != new.queue_depth
        or stored.missing != new.missing
        or stored.running != new.running
        or stored.stalled != new.stalled
        or abs(stored.kv_cache_usage - new.kv_cache_usage) >= KV_TOLERANCE
        or _rate_moved(stored.ttft_p50_s, new.ttft_p50_s, RATE_TOLERANCE)
        or _rate_moved(stored.tokens_per_s, new.tokens_per_s, RATE_TOLERANCE)
        or _rate_moved(stored.failure_ratio, new.failure_ratio, RATE_TOLERANCE)
    )
