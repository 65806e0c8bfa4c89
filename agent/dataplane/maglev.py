"""Weighted Maglev lookup tables, built the same way on every node.

`build_maglev_table(weights, size)` maps every slot of a prime-sized table to a
backend key ("IP:PORT"). Invariants the dataplane relies on:

* Pure and order-free: keys are sorted and hashed with BLAKE2b (never Python's
  salted `hash()`), so the same mapping gives the same table on every node and in
  any insertion order.
* Shares follow weights exactly (common.maglev_quota.slot_quotas): each backend's slot count is its weight share of
  `size`, rounded by largest remainder, so it is within one slot of the ideal
  (1:2 gives 1:2 with no normalising). Weight 0 means no slots.
* Low disruption: the paper's fill, one slot per turn. Backends take turns in
  key order; on its turn a backend with quota left takes the first free slot
  of its own permutation (offset + j * skip) mod size. A backend therefore
  keeps most of its preferred slots when others come or go, at every table
  size (a batched fill moves several times more slots, worst at small sizes).

Speed: the fill is a tight scalar loop (about size * ln(size) probes), so it is
compiled with numba (`_fill`, cached on disk after the first build): about 2 ms
for 1000 weighted backends at 65537 where the same loop in Python takes about
a second (scripts/bench-xdp measures it). Without numba the same function runs
in Python: the same table, slower.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from common.maglev_quota import DEFAULT_SIZE, MAX_WEIGHT, slot_quotas


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


def _fill_py(offsets: np.ndarray, skips: np.ndarray, quotas: np.ndarray, size: int) -> np.ndarray:
    """One slot per turn: slot -> backend index. sum(quotas) == size."""
    n = len(offsets)
    table = np.full(size, -1, dtype=np.int32)
    position = np.zeros(n, dtype=np.int64)
    remaining = quotas.copy()
    filled = 0
    while filled < size:
        for b in range(n):
            if remaining[b] == 0:
                continue
            slot = (offsets[b] + position[b] * skips[b]) % size
            while table[slot] >= 0:
                position[b] += 1
                slot = (offsets[b] + position[b] * skips[b]) % size
            table[slot] = b
            position[b] += 1
            remaining[b] -= 1
            filled += 1
    return table


try:
    from numba import njit

    _fill = njit(cache=True, nogil=True)(_fill_py)
except ImportError:  # the same table, built by the interpreter
    _fill = _fill_py


def build_maglev_indices(weights: Mapping[str, int], size: int = DEFAULT_SIZE) -> tuple[list[str], np.ndarray]:
    """The table as (sorted active keys, int32 array of indices into them).

    The dataplane writes this form straight into a BPF map; `build_maglev_table`
    turns it into keys.
    """
    _validate(weights, size)
    quotas = slot_quotas(weights, size)
    keys = sorted(quotas)
    params = np.asarray([_permutation(k, size) for k in keys], dtype=np.int64).reshape(len(keys), 2)
    table = _fill(params[:, 0].copy(), params[:, 1].copy(), np.asarray([quotas[k] for k in keys], dtype=np.int64),
                  size)
    return keys, table


def build_maglev_table(weights: Mapping[str, int], size: int = DEFAULT_SIZE) -> list[str]:
    """Slot -> backend key for a prime `size`; weights 0-32 per "IP:PORT" key.

    Raises ValueError for a non-prime size, an empty or all-zero mapping, or a
    weight outside 0-32.
    """
    keys, table = build_maglev_indices(weights, size)
    return np.asarray(keys, dtype=object)[table].tolist()
