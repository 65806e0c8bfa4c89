"""plan_rollout, table-driven: every strategy, step, breach, operator action, restart, failure, bound."""

from __future__ import annotations

import pytest

from common.rollouts import Rollout
from controlplane.rollouts import operate
from tests.controlplane.rollouts.rollout_data import NOW, counters, news, olds, record, rep, step

# -- rolling ----------------------------------------------------------------------------------------

ROLLING = [
    # (case, request kwargs, replicas, now, old_target, new_target)
    ("start adds one new (max_surge 1)", {}, olds(3), NOW, 3, 1),
    ("max_surge 2 adds two", {"max_surge": 2}, olds(3), NOW, 3, 2),
    ("max_unavailable 1 drains one old before any new is healthy", {"max_surge": 0, "max_unavailable": 1},
     olds(3), NOW, 2, 1),
    ("new Ready 10s < min_healthy 30s: old kept", {}, olds(3) + news(1, since=NOW - 10), NOW, 3, 1),
    ("new Ready 40s: one old drains, next new", {}, olds(3) + news(1, since=NOW - 40), NOW, 2, 2),
    ("two healthy new: one old left", {}, olds(3) + news(2), NOW, 1, 3),
    ("failed new replica never costs the last old one", {"max_unavailable": 2},
     olds(1) + [rep(0, 2, ready=False, phase="Failed")], NOW, 1, 3),
    ("new replica not ready: nothing drains", {}, olds(3) + news(1, ready=False), NOW, 3, 1),
]


@pytest.mark.parametrize("case,kw,replicas,now,old_target,new_target", ROLLING, ids=[c[0] for c in ROLLING])
def test_rolling_targets(case, kw, replicas, now, old_target, new_target):
    r = step(record("rolling", **kw), replicas, now=now)
    assert (r.record.old_target, r.record.new_target) == (old_target, new_target), r.record.message
    assert r.record.phase == "Progressing" and r.record.share is None


def test_rolling_targets_never_rise_back_when_a_new_replica_fails_later():
    rec = step(record("rolling"), olds(3) + news(2)).record
    assert rec.old_target == 1
    # One of the healthy new replicas fails: the old target does not go back up (no flapping),
    # but it never reaches 0 while no new replica is healthy.
    rec = step(rec, olds(1) + [rep(0, 2, ready=False), rep(1, 2, ready=False)]).record
    assert rec.old_target == 1


def test_rolling_promote_skips_min_healthy():
    rec = operate.operate(record("rolling"), "promote", NOW)
    r = step(rec, olds(3) + news(1, since=NOW - 1))
    assert r.record.old_target == 2


def test_rolling_succeeds_when_every_replica_is_new_and_healthy():
    rec = step(record("rolling"), olds(3) + news(3)).record
    assert rec.old_target == 0 and rec.phase == "Progressing"  # old ones still live (draining next)
    done = step(rec, olds(3, draining=True) + news(3))
    assert done.record.phase == "Succeeded" and done.record.finished_at == NOW
    assert done.activate == [2] and done.supersede == [1] and done.events == ["succeeded"]


def test_rolling_walk_to_the_end_respects_surge_and_unavailable_bounds():
    """Simulate the reconciler: each pass creates/drains to the targets; new replicas are healthy
    one tick later. At no point are there more than N + max_surge live replicas, fewer than
    N - max_unavailable ready ones, or zero ready old replicas while no new one is healthy."""
    n, surge, unavailable = 4, 1, 1
    rec = record("rolling", replicas=n, max_surge=surge, max_unavailable=unavailable, min_healthy_secs=0)
    old, new = olds(n), []
    for tick in range(40):
        r = step(rec, old + new)
        rec = r.record
        if rec.phase == "Succeeded":
            break
        new = [x.model_copy(update={"ready": True, "phase": "Ready", "ready_since": NOW - 1}) for x in new]
        while len(new) < rec.new_target:
            new.append(rep(len(new), 2, ready=False))
        old = old[: rec.old_target]
        ready = sum(1 for x in old + new if x.ready)
        assert len(old) + len(new) <= n + surge, tick
        assert ready >= n - unavailable - 1 or not new, tick  # the one being created is not ready yet
        assert old or any(x.ready for x in new), tick
    assert rec.phase == "Succeeded" and tick < 20


# -- canary -----------------------------------------------------------------------------------------

def canary(**kw):
    return record("canary", replicas=4, **kw)


def live_step(rec, replicas):
    return step(rec, replicas).record


def test_canary_waits_for_the_new_replica_at_share_zero():
    r = step(canary(), olds(4))
    assert (r.record.new_target, r.record.old_target, r.record.share) == (1, 4, 0)
    assert r.record.step_started_at is None and "waiting" in r.record.message


CANARY_STEPS = [
    # (steps kwargs, step index, percent, new replicas wanted of 4)
    ({}, 0, 5, 1), ({}, 1, 20, 1), ({}, 2, 50, 2), ({}, 3, 100, 4),
    ({"canary_percent": 20}, 0, 20, 1), ({"canary_percent": 20}, 1, 100, 4),
    ({"steps": [{"percent": 30, "secs": 10}, {"percent": 100}]}, 0, 30, 2),
]


@pytest.mark.parametrize("kw,index,percent,wanted", CANARY_STEPS)
def test_canary_step_share_and_set_size(kw, index, percent, wanted):
    rec = canary(**kw).model_copy(update={"step": index})
    r = step(rec, olds(4) + news(wanted))
    assert r.record.share == percent and r.record.new_target == wanted and r.record.step_started_at == NOW
    assert r.events == ["step"]
    short = step(rec, olds(4) + news(wanted - 1) if wanted > 1 else olds(4))
    assert short.record.step_started_at is None and short.record.share == 0


def test_canary_step_holds_for_its_secs_then_moves_on():
    rec = live_step(canary(), olds(4) + news(1))
    assert step(rec, olds(4) + news(1), now=NOW + 299).record.step == 0
    nxt = step(rec, olds(4) + news(1), now=NOW + 300)
    assert nxt.record.step == 1 and nxt.record.share == 20  # 20 % needs one new replica too: live at once
    assert nxt.record.step_started_at == NOW + 300


def test_canary_last_step_removes_the_old_set_then_succeeds():
    rec = canary().model_copy(update={"step": 3})
    r = step(rec, olds(4) + news(4))
    assert r.record.share == 100 and r.record.old_target == 0 and r.record.phase == "Progressing"
    done = step(r.record, olds(4, draining=True) + news(4))
    assert done.record.phase == "Succeeded" and done.activate == [2] and done.supersede == [1]


BREACHES = [
    # (case, new replica counters at window start, now, expected breach words or None)
    ("error rate above 5%", (0, 0, 0, 0), (100, 10, 10, 100), "error rate 10.0%"),
    ("error rate at 5% is fine", (0, 0, 0, 0), (100, 5, 10, 100), None),
    ("too few requests to judge", (0, 0, 0, 0), (10, 9, 1, 10), None),
    ("mean TTFT above 5000 ms", (0, 0, 0, 0), (40, 0, 240, 40), "mean TTFT 6000 ms"),
    ("only the window counts, not earlier failures", (1000, 900, 0, 0), (1100, 901, 10, 100), None),
    ("engine restart (counters went back) starts a new base", (1000, 900, 0, 0), (50, 40, 0, 0), None),
]


@pytest.mark.parametrize("case,base,current,words", BREACHES, ids=[b[0] for b in BREACHES])
def test_canary_breach_pauses_and_rolls_back(case, base, current, words):
    new = news(1)
    rec = step(canary(), olds(4) + new, obs=[counters(new[0].replica_id, *base)]).record
    assert rec.share == 5 and new[0].replica_id in rec.window
    r = step(rec, olds(4) + new, obs=[counters(new[0].replica_id, *current)], now=NOW + 10)
    if words is None:
        assert r.record.phase == "Progressing" and r.events == []
        return
    assert r.record.phase == "RollingBack" and words in r.record.message
    assert r.events == ["paused", "rollback"]
    assert r.record.share == 0 and r.record.new_target == 0 and r.record.old_target == 4


def test_custom_thresholds_apply():
    new = news(1)
    rec = step(canary(thresholds={"error_rate_max": 0.5, "ttft_ms_max": None, "min_requests": 5}),
               olds(4) + new, obs=[counters(new[0].replica_id)]).record
    ok = step(rec, olds(4) + new, obs=[counters(new[0].replica_id, 10, 4, 1000, 10)], now=NOW + 1)
    assert ok.record.phase == "Progressing"  # 40 % < 50 %, TTFT not judged
    bad = step(rec, olds(4) + new, obs=[counters(new[0].replica_id, 10, 6, 0, 10)], now=NOW + 1)
    assert bad.record.phase == "RollingBack"


def test_canary_promote_jumps_to_the_last_step():
    rec = operate.operate(live_step(canary(), olds(4) + news(1)), "promote", NOW)
    r = step(rec, olds(4) + news(1))
    assert r.record.step == 3 and r.record.new_target == 4 and "promoted" in r.events
    assert r.record.share == 5  # 100 % only once all four new replicas are ready


# -- blue/green -------------------------------------------------------------------------------------

def bg(**kw):
    return record("blue-green", replicas=2, rollback_window_secs=60, **kw)


def test_blue_green_builds_the_full_set_at_weight_zero_and_waits_for_promote():
    r = step(bg(), olds(2) + news(1))
    assert (r.record.new_target, r.record.old_target, r.record.share) == (2, 2, 0) and not r.record.switched
    ready = step(r.record, olds(2) + news(2))
    assert ready.record.share == 0 and "waiting for promote" in ready.record.message


@pytest.mark.parametrize("how", ["promote", "auto_promote"])
def test_blue_green_switches_in_one_save(how):
    rec = operate.operate(bg(), "promote", NOW) if how == "promote" else bg(auto_promote=True)
    r = step(rec, olds(2) + news(2))
    assert r.record.switched and r.record.share == 100 and r.record.old_target == 2
    assert r.events == ["switched"] and r.saved


def test_blue_green_keeps_the_old_set_for_the_window_then_removes_it():
    rec = step(bg(auto_promote=True), olds(2) + news(2)).record
    assert step(rec, olds(2) + news(2), now=NOW + 59).record.old_target == 2
    gone = step(rec, olds(2) + news(2), now=NOW + 60).record
    assert gone.old_target == 0
    done = step(gone, news(2), now=NOW + 61)
    assert done.record.phase == "Succeeded" and done.activate == [2]


def test_blue_green_rollback_after_switch_restores_the_old_set():
    rec = step(bg(auto_promote=True), olds(2) + news(2)).record
    rec = operate.operate(rec, "rollback", NOW + 5)
    assert rec.share == 0  # the operator's save already moves new connections back
    r = step(rec, olds(2) + news(2), now=NOW + 6)
    assert r.record.new_target == 0 and r.record.old_target == 2 and r.record.share == 0
    done = step(r.record, olds(2) + news(2, draining=True), now=NOW + 40)
    assert done.record.phase == "RolledBack" and done.activate == [1] and done.events == ["rolled-back"]


# -- rollback, pause, restart ----------------------------------------------------------------------

def test_rollback_never_removes_old_replicas_and_restores_the_count():
    rec = operate.operate(step(record("rolling"), olds(3) + news(2)).record, "rollback", NOW)
    r = step(rec, olds(1) + news(2))
    assert r.record.old_target == 3  # old replicas come back
    assert r.record.new_target == 2  # new ones stay until old ones are ready again
    r2 = step(r.record, olds(3) + news(2))
    assert r2.record.new_target == 0


def test_rollback_with_no_ready_old_replica_keeps_the_new_set_routed():
    rec = operate.operate(live_step(canary(), olds(4) + news(1)), "rollback", NOW)
    r = step(rec, olds(4, ready=False) + news(1))
    assert r.record.share is None and r.record.new_target == 1


def test_paused_rollout_holds_even_through_a_breach():
    new = news(1)
    rec = step(canary(), olds(4) + new, obs=[counters(new[0].replica_id)]).record
    paused = operate.operate(rec, "pause", NOW)
    r = step(paused, olds(4) + new, obs=[counters(new[0].replica_id, 100, 100)], now=NOW + 1000)
    assert not r.saved and r.events == []
    resumed = operate.operate(paused, "resume", NOW + 1000)
    assert resumed.step_started_at == NOW + 1000 and resumed.window == {}
    # The window restarts at resume: the failures before it do not count.
    r = step(resumed, olds(4) + new, obs=[counters(new[0].replica_id, 100, 100)], now=NOW + 1001)
    assert r.record.phase == "Progressing"


@pytest.mark.parametrize("strategy,replicas", [
    ("rolling", olds(3) + news(1, since=NOW - 40)),
    ("canary", olds(3) + news(1)),
    ("blue-green", olds(3) + news(3)),
])
def test_restart_mid_phase_continues_from_the_stored_record(strategy, replicas):
    """A record read back from its stored JSON (a restarted fabricd or a new leader) plans the
    same next move as the process that wrote it."""
    kw = {"auto_promote": True} if strategy == "blue-green" else {}
    first = step(record(strategy, **kw), replicas).record
    reloaded = Rollout.model_validate_json(first.model_dump_json())
    later = NOW + 400
    assert step(reloaded, replicas, now=later).record == step(first, replicas, now=later).record
    assert reloaded.step_started_at == first.step_started_at and reloaded.old_target == first.old_target


def test_finished_rollouts_plan_nothing():
    rec = record("canary").model_copy(update={"phase": "Succeeded"})
    assert step(rec, olds(3)).events == [] and not step(rec, olds(3)).saved


# -- operator actions --------------------------------------------------------------------------------

OPS = [
    ("pause", "Progressing", "Paused"), ("resume", "Paused", "Progressing"),
    ("rollback", "Progressing", "RollingBack"), ("rollback", "Paused", "RollingBack"),
    ("promote", "Paused", "Progressing"),
]


@pytest.mark.parametrize("action,before,after", OPS)
def test_operator_actions(action, before, after):
    rec = record("canary").model_copy(update={"phase": before})
    assert operate.operate(rec, action, NOW).phase == after


@pytest.mark.parametrize("action,phase,code", [
    ("pause", "Paused", "already_paused"), ("resume", "Progressing", "not_paused"),
    ("promote", "Succeeded", "rollout_finished"), ("rollback", "RolledBack", "rollout_finished"),
    ("pause", "RollingBack", "rolling_back"),
])
def test_operator_actions_refused(action, phase, code):
    from common.errors import Conflict

    with pytest.raises(Conflict) as err:
        operate.operate(record("canary").model_copy(update={"phase": phase}), action, NOW)
    assert err.value.code == code


def test_start_refuses_the_running_revision_and_an_immovable_rolling_update():
    from common.errors import Conflict, InvalidInput
    from common.rollouts import RolloutRequest

    with pytest.raises(Conflict):
        operate.start(RolloutRequest(), rollout_id=1, deployment="d", from_revision=2, to_revision=2,
                      replicas=1, who="a", now=NOW)
    with pytest.raises(InvalidInput):
        operate.start(RolloutRequest(max_surge=0, max_unavailable=1), rollout_id=1, deployment="d",
                      from_revision=1, to_revision=2, replicas=1, who="a", now=NOW)


@pytest.mark.parametrize("strategy", ["rolling", "canary", "blue-green"])
def test_a_deployment_scaled_to_zero_switches_revision_at_once(strategy):
    r = step(record(strategy, replicas=0), [])
    assert r.record.phase == "Succeeded" and r.activate == [2] and r.record.new_target == 0
