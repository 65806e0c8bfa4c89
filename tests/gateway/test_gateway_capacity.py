"""Saturation and pool spillover (gateway.capacity) as tables."""

from __future__ import annotations

import pytest

from common.schemas import Replica
from gateway.capacity import Reading, Saturation, choose_pool, replica_saturated

NOW = 1000.0


def rep(rid: str) -> Replica:
    return Replica(replica_id=rid, deployment=rid.split("-")[0], ordinal=0, node="n", host="127.0.0.1", ready=True)


@pytest.mark.parametrize("reading, measure, full", [
    (Reading(5, 0.1, NOW), Saturation(queue=4), True),
    (Reading(4, 0.1, NOW), Saturation(queue=4), False),  # at the healthy depth is fine
    (Reading(0, 0.95, NOW), Saturation(kv=0.9), True),
    (Reading(9, 0.95, NOW), Saturation(), False),  # nothing measured
    (Reading(9, 0.95, NOW - 31), Saturation(queue=4, kv=0.9), False),  # stale says nothing
    (None, Saturation(queue=4), False),
])
def test_replica_saturated(reading, measure, full):
    assert replica_saturated(reading, measure, NOW) is full


H200, H100, A100 = [rep("h200-0"), rep("h200-1")], [rep("h100-0")], [rep("a100-0")]


@pytest.mark.parametrize("loads, index, all_full", [
    ({}, 0, False),
    ({"h200-0": 9}, 0, False),  # one replica of the preferred pool has room
    ({"h200-0": 9, "h200-1": 9}, 1, False),  # spill to the next
    ({"h200-0": 9, "h200-1": 9, "h100-0": 9}, 2, False),
    ({"h200-0": 9, "h200-1": 9, "h100-0": 9, "a100-0": 9}, 0, True),  # all saturated: keep the preferred
    ({"h100-0": 9}, 0, False),
])
def test_spillover_order(loads, index, all_full):
    readings = {rid: Reading(q, 0.0, NOW) for rid, q in loads.items()}
    choice = choose_pool([H200, H100, A100], readings, Saturation(queue=4), NOW)
    assert (choice.index, choice.all_saturated) == (index, all_full)


def test_an_empty_pool_is_passed_over_and_unmeasured_pools_never_saturate():
    assert choose_pool([[], H100], {}, Saturation(), NOW).index == 1
    assert choose_pool([[], []], {}, Saturation(), NOW).all_saturated
    readings = {"h200-0": Reading(99, 1.0, NOW), "h200-1": Reading(99, 1.0, NOW)}
    assert choose_pool([H200, H100], readings, Saturation(), NOW).index == 0
