"""LoRA adapter placement (gateway.adapters.plan_adapter) as a table."""

from __future__ import annotations

import pytest

from gateway.adapters import plan_adapter

R = ["r0", "r1"]


@pytest.mark.parametrize("held, busy, in_flight, saturated, want", [
    ({}, set(), {}, set(), ("r0", True, None)),  # nobody holds it: the replica with room
    ({"r0": ["x"]}, set(), {}, set(), ("r1", True, None)),  # fewest held first
    ({"r1": ["a"]}, set(), {}, set(), ("r1", False, None)),  # a holder wins
    ({"r0": ["a"], "r1": ["a"]}, set(), {"r0": 3}, set(), ("r1", False, None)),  # least in flight of holders
    ({"r1": ["a"]}, set(), {}, {"r1"}, ("r0", True, None)),  # the holder is saturated: load elsewhere
    ({"r0": ["x", "y"], "r1": ["z", "w"]}, set(), {}, set(), ("r0", True, "x")),  # full: LRU idle goes
    ({"r0": ["x", "y"], "r1": ["z", "w"]}, {("r0", "x")}, {}, set(), ("r0", True, "y")),  # busy is kept
    ({"r0": ["x", "y"], "r1": ["z", "w"]}, {("r0", "x"), ("r0", "y")}, {"r0": 2}, set(), ("r1", True, "z")),
    ({"r0": ["x", "y"], "r1": ["z", "w"]}, {("r0", "x"), ("r0", "y")}, {}, {"r1"}, ("r1", True, "z")),
    ({"r1": ["a"]}, set(), {}, {"r0", "r1"}, ("r1", False, None)),  # all saturated: the holder anyway
])
def test_plan(held, busy, in_flight, saturated, want):
    plan = plan_adapter(R, "a", held, busy, in_flight, saturated, cap=2)
    assert (plan.replica, plan.load, plan.unload) == want


def test_every_slot_busy_is_no_plan():
    held = {"r0": ["x", "y"], "r1": ["z", "w"]}
    busy = {("r0", "x"), ("r0", "y"), ("r1", "z"), ("r1", "w")}
    assert plan_adapter(R, "a", held, busy, {}, set(), cap=2) is None
