"""The stall detector (pure): an engine with requests running whose generated-token counter does
not move is stalled, even while its /health answers.

``stall_since`` carries, per replica, when it was first seen running with no token progress;
a replica stalled for ``stall_s`` (FABRIC_STALL_SECS, 60 s) is marked ``stalled`` in its
observation, and the routing plan then gives it weight 0 while keeping it in the Maglev
service (like a draining backend: no new flows, its established ones stay, so a stall that
clears loses nothing). The routing controller records ReplicaStalled / ReplicaUnstalled events
on the transitions. Unknown progress (no token counter, a failed scrape, the first scrape with
nothing to compare to) is never a stall.
"""

from __future__ import annotations

from common.schemas import ReplicaObservation


def stall_since(previous: float | None, obs: ReplicaObservation) -> float | None:
    """When this run of no progress began (the observation's scrape time), or None."""
    if obs.ok and obs.running > 0 and obs.tokens_per_s is not None and obs.tokens_per_s <= 0:
        return previous if previous is not None else obs.scraped_at
    return None


def mark(obs: ReplicaObservation, since: float | None, stall_s: float) -> ReplicaObservation:
    stalled = since is not None and obs.scraped_at - since >= stall_s
    if obs.stalled == stalled and obs.stalled_since == since:
        return obs
    return obs.model_copy(update={"stalled": stalled, "stalled_since": since})
