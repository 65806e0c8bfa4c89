"""The queue hold (pure): a replica's queue is the highest waiting count of its last few scrapes.

vLLM's ``vllm:num_requests_waiting`` is a gauge set once per engine step batch; on the CPU engine
under steady load it read 0 in a good share of one-second samples while requests never stopped
arriving (docs/runtimes.md, "Queue gauges flap"), so one scrape's reading made least_queue weights
jump back to 32 between two busy readings. The hold keeps the readings of the last
``QUEUE_HOLD_SCRAPES`` (3) successful scrapes, none older than ``QUEUE_HOLD_S`` (15 s, half the
30 s eligibility window), and the observation's ``queue_depth`` is their maximum: a rise counts
at once, a fall only once the higher readings aged out (two routing periods in the lab's 2 s, one
at the default 10 s). ``queue_reads`` keeps those readings in the observation, so explain routing
shows what the weight came from. A failed scrape keeps the readings it had; everything that
reads ``queue_depth`` (weights, autoscaling, the gateway's shedding, site spill) reads the held
value.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.schemas import ReplicaObservation

QUEUE_HOLD_SCRAPES = 3
QUEUE_HOLD_S = 15.0


def kept(earlier: Sequence[tuple[float, float]], now: float) -> list[tuple[float, float]]:
    """The (scraped_at, waiting) readings before ``now`` that still count, oldest first."""
    recent = [(t, q) for t, q in earlier if now - t < QUEUE_HOLD_S]
    return recent[-(QUEUE_HOLD_SCRAPES - 1):] if QUEUE_HOLD_SCRAPES > 1 else []


def hold(obs: ReplicaObservation, earlier: Sequence[tuple[float, float]]) -> ReplicaObservation:
    """``obs`` with its queue held: queue_reads = the kept readings plus this one, queue_depth their maximum."""
    if not obs.ok:
        return obs
    reads = [q for _, q in kept(earlier, obs.scraped_at)] + [obs.queue_depth]
    return obs.model_copy(update={"queue_depth": max(reads), "queue_reads": reads})


def describe(obs: ReplicaObservation) -> str:
    """' (the highest of its last 3 scrapes: 6, 0, 0)' when the hold set the queue, else ''."""
    reads = obs.queue_reads
    if len(reads) < 2 or reads[-1] == obs.queue_depth:
        return ""
    return f" (the highest of its last {len(reads)} scrapes: {', '.join(f'{q:g}' for q in reads)})"
