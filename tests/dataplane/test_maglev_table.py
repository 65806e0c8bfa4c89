"""Unit tests of the weighted Maglev builder (agent/dataplane/maglev.py)."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest

from agent.dataplane.maglev import build_maglev_table, slot_quotas


def _backends(n: int, seed: int = 7) -> dict[str, int]:
    rng = random.Random(seed)
    return {f"10.{i // 250}.{i % 250}.9:8000": rng.randint(1, 32) for i in range(n)}


def test_same_mapping_in_any_order_gives_same_table():
    weights = _backends(50)
    items = list(weights.items())
    random.Random(1).shuffle(items)
    assert build_maglev_table(dict(items), 1021) == build_maglev_table(weights, 1021)


@pytest.mark.parametrize("n", [1, 3, 37, 1000])
def test_shares_within_a_tenth_of_a_point(n):
    weights = _backends(n)
    table = build_maglev_table(weights)
    assert len(table) == 65537
    counts = Counter(table)
    total = sum(weights.values())
    for key, weight in weights.items():
        assert abs(counts[key] / 65537 - weight / total) * 100 < 0.1, key


def test_weights_need_no_normalising_and_zero_gets_nothing():
    table = build_maglev_table({"a:1": 1, "b:1": 2, "c:1": 0}, 65537)
    counts = Counter(table)
    assert "c:1" not in counts
    assert abs(counts["b:1"] - 2 * counts["a:1"]) <= 2
    assert slot_quotas({"a:1": 1, "b:1": 2}, 7) == {"a:1": 2, "b:1": 5}


@pytest.mark.parametrize(
    "weights,size",
    [
        ({"a:1": 1}, 65536),
        ({"a:1": 1}, 1),
        ({}, 65537),
        ({"a:1": 0, "b:1": 0}, 65537),
        ({"a:1": 33}, 65537),
        ({"a:1": -1}, 65537),
        ({"a:1": 1.5}, 65537),
        ({"": 1}, 65537),
    ],
)
def test_bad_input_raises_value_error(weights, size):
    with pytest.raises(ValueError):
        build_maglev_table(weights, size)


def reference_maglev(weights: dict[str, int], size: int) -> list[str]:
    """The paper's fill written out plainly (Eisenbud et al. 2016, pseudocode 1),
    with each backend's turn skipped once it holds its quota: one slot per turn."""
    quotas = slot_quotas(weights, size)
    keys = sorted(quotas)
    perms = []
    for key in keys:
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        perms.append((int.from_bytes(digest[:8], "little") % size,
                      int.from_bytes(digest[8:], "little") % (size - 1) + 1))
    nxt = [0] * len(keys)
    table: list[str | None] = [None] * size
    filled = 0
    while filled < size:
        for i, key in enumerate(keys):
            if quotas[key] == 0:
                continue
            offset, skip = perms[i]
            c = (offset + nxt[i] * skip) % size
            while table[c] is not None:
                nxt[i] += 1
                c = (offset + nxt[i] * skip) % size
            table[c] = key
            nxt[i] += 1
            quotas[key] -= 1
            filled += 1
    return table


def disruption(before: list[str], after: list[str], removed: str) -> float:
    """Share of the slots whose backend stayed that changed backend anyway."""
    return sum(1 for b, a in zip(before, after) if b != a and b != removed) / len(before)


@pytest.mark.parametrize("size", [4099, 65537])
@pytest.mark.parametrize("n", [3, 10, 100, 1000])
def test_removal_disrupts_no_more_than_the_papers_one_slot_per_turn_fill(n, size):
    weights = {f"10.0.{i // 250}.{i % 250}:80": 1 for i in range(n)}
    removed = sorted(weights)[n // 2]
    smaller = {k: w for k, w in weights.items() if k != removed}
    before, after = build_maglev_table(weights, size), build_maglev_table(smaller, size)
    ref_before, ref_after = reference_maglev(weights, size), reference_maglev(smaller, size)
    assert all(a != removed for a in after)
    ours, paper = disruption(before, after, removed), disruption(ref_before, ref_after, removed)
    assert ours <= paper, (ours, paper)
    assert before == ref_before and after == ref_after  # the same fill, compiled


def test_weighted_tables_match_the_reference_and_shares_are_exact_to_one_slot():
    weights = _backends(60, seed=3)
    table = build_maglev_table(weights, 4099)
    assert table == reference_maglev(weights, 4099)
    counts = Counter(table)
    total = sum(weights.values())
    for key, weight in weights.items():
        assert abs(counts[key] - 4099 * weight / total) < 1, key
