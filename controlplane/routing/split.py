"""Maglev weights that give a replica set a chosen share of the table.

The agent builds a 65537-slot table where each backend gets its weight share of the slots
(common.maglev_quota.slot_quotas). To give the new revision ``percent`` of new connections the
set weights W_new : W_old must be ``percent : 100 - percent``; inside each set the routing
strategy's per-replica weights (1-32) keep their proportions as closely as integers allow.

``split(new, old, percent)`` takes {replica: strategy weight} for each set and returns
{replica: weight} (0-32). It tries the set totals whose ratio is closest to the target, those
that keep the strategy's proportions best first (then the largest totals), and keeps the first whose
table share lands within one slot of ``percent`` of the table; ``table_share`` is what the
agent will build. A share no 1-32 weights can express (33 % with one replica per set) gets the
nearest one, and ``Split.slot_error`` says how far it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.maglev_quota import DEFAULT_SIZE, MAX_WEIGHT, slot_quotas

MAX_TRIES = 64


@dataclass(frozen=True)
class Split:
    weights: dict[str, int]
    new_slots: int  # slots of the new set in the table the agent builds
    size: int
    percent: int

    @property
    def table_share(self) -> float:
        return self.new_slots / self.size

    @property
    def slot_error(self) -> float:
        """Slots between the new set's share and the exact target."""
        return abs(self.new_slots - self.percent * self.size / 100)


def apportion(total: int, base: Mapping[str, int]) -> dict[str, int]:
    """``total`` spread over ``base``'s keys in proportion to its weights, each 1..MAX_WEIGHT
    (largest remainder, ties by key). Needs len(base) <= total <= MAX_WEIGHT * len(base)."""
    keys = sorted(base)
    out = {k: 1 for k in keys}
    left = total - len(keys)
    while left > 0:
        room = [k for k in keys if out[k] < MAX_WEIGHT]
        weight_sum = sum(max(1, base[k]) for k in room)
        shares = {k: left * max(1, base[k]) / weight_sum for k in room}
        given = 0
        for k in room:
            add = min(int(shares[k]), MAX_WEIGHT - out[k])
            out[k] += add
            given += add
        if given == 0:  # hand out the remainder one by one, biggest fraction first
            for k in sorted(room, key=lambda k: (-(shares[k] - int(shares[k])), k))[:left]:
                out[k] += 1
                given += 1
        left -= given
    return out


def _distortion(got: Mapping[str, int], base: Mapping[str, int]) -> float:
    """How far ``got``'s proportions are from ``base``'s (sum of share differences)."""
    g, b = sum(got.values()), sum(max(1, v) for v in base.values())
    return sum(abs(got[k] / g - max(1, base[k]) / b) for k in base)


def _candidates(n_new: int, n_old: int, percent: int) -> list[tuple[int, int]]:
    """(W_new, W_old) pairs, the closest ratio first, then the largest totals."""
    pairs = set()
    for w_new in range(n_new, MAX_WEIGHT * n_new + 1):
        ideal = w_new * (100 - percent) / percent
        for w_old in {int(ideal), int(ideal) + 1}:
            pairs.add((w_new, min(max(w_old, n_old), MAX_WEIGHT * n_old)))
    for w_old in range(n_old, MAX_WEIGHT * n_old + 1):  # the new side may be the one that binds
        ideal = w_old * percent / (100 - percent)
        for w_new in {int(ideal), int(ideal) + 1}:
            pairs.add((min(max(w_new, n_new), MAX_WEIGHT * n_new), w_old))
    target = percent / 100
    return sorted(pairs, key=lambda p: (abs(p[0] / (p[0] + p[1]) - target), -(p[0] + p[1]), p))


def split(new: Mapping[str, int], old: Mapping[str, int], percent: int, size: int = DEFAULT_SIZE) -> Split:
    """Weights for both sets (see the module docstring). Keys are the backends' table keys."""
    if not new or percent <= 0:
        weights = {**dict(old), **{k: 0 for k in new}}
        return Split(weights, 0, size, percent)
    if not old or percent >= 100:
        weights = {**{k: 0 for k in old}, **dict(new)}
        return Split(weights, size, size, percent)
    best = None
    tried = []
    for w_new, w_old in _candidates(len(new), len(old), percent)[:MAX_TRIES]:
        n_w, o_w = apportion(w_new, new), apportion(w_old, old)
        tried.append((round(abs(w_new / (w_new + w_old) - percent / 100), 12),
                      _distortion(n_w, new) + _distortion(o_w, old), -(w_new + w_old), {**n_w, **o_w}))
    tried.sort(key=lambda t: t[:3])
    for *_, weights in tried:
        quotas = slot_quotas(weights, size)
        got = Split(weights, sum(quotas.get(k, 0) for k in new), size, percent)
        if best is None or got.slot_error < best.slot_error:
            best = got
        if got.slot_error <= 1:
            break
    assert best is not None  # _candidates is never empty: both loops clamp into range
    return best
