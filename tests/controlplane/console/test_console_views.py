"""Pure shaping of API answers for the console's pictures."""

from __future__ import annotations

from controlplane.console.views import capacity_strip, replicas_by_revision, weight_bars


def test_capacity_strip_sums_nodes_and_reports_used_share():
    strip = capacity_strip({"gpus_free": 1, "gpus_total": 4, "nodes": [
        {"cpu_free": 6, "cpu_allocatable": 8, "memory_free_gib": 10.0, "memory_allocatable_gib": 40.0},
        {"cpu_free": 2, "cpu_allocatable": 8, "memory_free_gib": 0.0, "memory_allocatable_gib": 0.0}]})
    by = {s["label"]: s for s in strip}
    assert (by["GPUs"]["free"], by["GPUs"]["total"], by["GPUs"]["used_pct"]) == (1, 4, 75)
    assert (by["CPU"]["free"], by["CPU"]["total"], by["CPU"]["used_pct"]) == (8, 16, 50)
    assert by["Memory"]["used_pct"] == 75
    assert capacity_strip({"nodes": []})[0]["used_pct"] == 0  # an empty cluster draws no division by zero


def test_replicas_group_by_revision_newest_first():
    groups = replicas_by_revision([{"revision": 1, "ordinal": 1, "ready": True},
                                   {"revision": 2, "ordinal": 2, "ready": False},
                                   {"revision": 1, "ordinal": 0, "ready": True}])
    assert [g["revision"] for g in groups] == [2, 1]
    assert [r["ordinal"] for r in groups[1]["replicas"]] == [0, 1] and groups[1]["ready"] == 2


def test_weight_bars_scale_to_the_largest_and_excluded_replicas_have_no_share():
    bars = weight_bars({"replicas": [
        {"replica_id": "a", "weight": 300, "included": True, "reason": "queue 0"},
        {"replica_id": "b", "weight": 100, "included": True, "reason": "queue 2"},
        {"replica_id": "c", "weight": 0, "included": False, "reason": "not ready"}]})
    assert [(b["width_pct"], b["share_pct"]) for b in bars] == [(100, 75), (33, 25), (0, 0)]
    assert bars[2]["reason"] == "not ready"


def test_a_finished_rollout_says_how_it_ended_and_a_running_canary_its_step_from_one():
    from controlplane.console.views import rollout_state

    canary = {"strategy": "canary", "from_revision": 1, "to_revision": 2, "steps": [{"percent": 10}, {"percent": 50}]}
    assert rollout_state({**canary, "phase": "Progressing", "step": 0}) == "Progressing, step 1 of 2"
    assert rollout_state({**canary, "phase": "Paused", "step": 1}) == "Paused, step 2 of 2"
    assert rollout_state({**canary, "phase": "Succeeded", "step": 1}) == "Succeeded: rev 2 serves all traffic"
    assert rollout_state({**canary, "phase": "RolledBack", "step": 0}) == "RolledBack: rev 1 serves all traffic"
    assert rollout_state({"phase": "Progressing", "strategy": "rolling", "steps": []}) == "Progressing"
