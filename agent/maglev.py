"""Weighted Maglev lookup tables, built the same way on every node.

`build_maglev_table(weights, size)` maps every slot of a prime-sized table to a
backend key ("IP:PORT"). Invariants the dataplane relies on:

* Pure and order-free: keys are sorted and hashed with BLAKE2b (never Python's
  salted `hash()`), so the same mapping gives the same table on every node and in
  any insertion order.
* Shares follow weights exactly (common.maglev_quota.slot_quotas): each backend's slot count is its weight share of
  `size`, rounded by largest remainder, so it is within one slot of the ideal
  (1:2 gives 1:2 with no normalising). Weight 0 means no slots.
* Low disruption: each backend walks its own Maglev permutation
  (offset + j * skip) mod size and takes the first free slots on it, so a
  backend keeps most of its preferred slots when others come or go.

Speed: the textbook loop (one slot per turn, one probe at a time) costs about a
second in pure Python for 65537 slots. Here a backend takes a batch of slots per
turn (its quota divided into a bounded number of rounds) and probes a vector of
permutation positions at once with numpy, which keeps Python-level iterations to
a few thousand whatever the backend count.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from common.maglev_quota import DEFAULT_SIZE, MAX_WEIGHT, slot_quotas

# Upper bound on Python-level turns (backends x rounds): fewer rounds means
# coarser interleaving between backends, more rounds means more interpreter time.
_TURN_BUDGET = 4096


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def _validate(weights: Mapping[str, int], size: int) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not is_prime(size):
        raise ValueError(f"table size must be a prime number, got {size!r}")
    if not weights:
        raise ValueError("weights must name at least one backend")
    for key, weight in weights.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"backend key must be a non-empty string, got {key!r}")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= MAX_WEIGHT:
            raise ValueError(f"weight of {key} must be an integer 0-{MAX_WEIGHT}, got {weight!r}")
    if all(w == 0 for w in weights.values()):
        raise ValueError("at least one backend needs a weight above 0")


def _permutation(key: str, size: int) -> tuple[int, int]:
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
    offset = int.from_bytes(digest[:8], "little") % size
    skip = int.from_bytes(digest[8:], "little") % (size - 1) + 1
    return offset, skip


def build_maglev_indices(weights: Mapping[str, int], size: int = DEFAULT_SIZE) -> tuple[list[str], np.ndarray]:
    """The table as (sorted active keys, int32 array of indices into them).

    The dataplane writes this form straight into a BPF map; `build_maglev_table`
    turns it into keys.
    """
    _validate(weights, size)
    quotas = slot_quotas(weights, size)
    keys = sorted(quotas)
    n = len(keys)
    params = [_permutation(k, size) for k in keys]
    remaining = [quotas[k] for k in keys]
    rounds = max(1, min(max(remaining), _TURN_BUDGET // n))
    per_turn = [-(-q // rounds) for q in remaining]
    position = [0] * n
    table = np.full(size, -1, dtype=np.int32)
    free = np.ones(size, dtype=bool)
    free_count = size
    while free_count:
        for b in range(n):
            need = min(per_turn[b], remaining[b])
            if need == 0:
                continue
            offset, skip = params[b]
            taken_total = 0
            while taken_total < need:
                want = need - taken_total
                # Size the probe window from the free fraction so one numpy call
                # usually finds all wanted slots, even when the table is nearly full.
                window = min(size, int(want * size / free_count * 1.25) + 16)
                steps = np.arange(position[b], position[b] + window, dtype=np.int64)
                candidates = (offset + steps * skip) % size
                hits = np.flatnonzero(free[candidates])
                if len(hits) >= want:
                    hits = hits[:want]
                    position[b] += int(hits[-1]) + 1
                else:
                    position[b] += window
                slots = candidates[hits]
                free[slots] = False
                table[slots] = b
                taken_total += len(slots)
                free_count -= len(slots)
            remaining[b] -= need
    return keys, table


def build_maglev_table(weights: Mapping[str, int], size: int = DEFAULT_SIZE) -> list[str]:
    """Slot -> backend key for a prime `size`; weights 0-32 per "IP:PORT" key.

    Raises ValueError for a non-prime size, an empty or all-zero mapping, or a
    weight outside 0-32.
    """
    keys, table = build_maglev_indices(weights, size)
    return np.asarray(keys, dtype=object)[table].tolist()
