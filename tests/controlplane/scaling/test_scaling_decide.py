"""Table-driven tests of controlplane.scaling.decide: every rule, every hold, stale metrics,
quota refusal, cooldown, cold start. Each case is plain data: spec, replicas with their last
scrape, memory, now -> expected action, target and code (and a phrase of the reason)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from common.schemas import (
    AutoscalingSpec,
    DeploymentStatus,
    InferenceDeployment,
    Replica,
    ReplicaObservation,
    TenantQuota,
)
from controlplane.scaling.decide import Memory, Observations, QuotaView, decide
from controlplane.tenancy.quotas import Amount

NOW = 10_000.0
SPEC = {"min_replicas": 1, "max_replicas": 4, "scale_out_queue": 20, "scale_out_seconds": 30, "scale_in_queue": 2,
            "scale_in_seconds": 60, "cooldown_seconds": 60}


@dataclass
class Case:
    id: str
    desired: int
    queues: list[float | None]  # one per ready replica; None: no scrape; "stale" via ages
    expect: tuple[str, int, str]  # action, target replicas, code
    spec: dict = field(default_factory=dict)
    ages: list[float] | None = None  # seconds since each replica's scrape (default 1)
    ok: list[bool] | None = None
    ttft_s: list[float | None] | None = None
    memory: Memory = field(default_factory=Memory)
    starting: int = 0  # replicas created but not ready
    demand_at: float | None = None
    quota: QuotaView | None = None
    phase: str = "Ready"
    reason: str = ""
    running: list[float] | None = None  # requests running per ready replica (default 0)
    finished: list[float] | None = None  # finished-request counters per ready replica
    scaled_at: float | None = None  # when the count last changed (status.scaled_at)


def build(case: Case):
    dep = InferenceDeployment(name="d", model="m", profile="p", replicas=case.desired,
                              status=DeploymentStatus(phase=case.phase, scaled_at=case.scaled_at))
    reps, metrics = [], {}
    for i, q in enumerate(case.queues):
        rid = f"d-{i}"
        reps.append(Replica(replica_id=rid, deployment="d", ordinal=i, node="n", ready=True, phase="Ready",
                            host="127.0.0.1"))
        if q is None:
            continue
        age = case.ages[i] if case.ages else 1.0
        metrics[rid] = ReplicaObservation(replica_id=rid, scraped_at=NOW - age, ok=case.ok[i] if case.ok else True,
                                          queue_depth=q, ttft_p50_s=case.ttft_s[i] if case.ttft_s else None,
                                          running=case.running[i] if case.running else 0,
                                          finished_total=case.finished[i] if case.finished else None)
    for j in range(case.starting):
        i = len(case.queues) + j
        reps.append(Replica(replica_id=f"d-{i}", deployment="d", ordinal=i, node="n", phase="Starting"))
    spec = AutoscalingSpec(**{**SPEC, **case.spec})
    obs = Observations(replicas=reps, metrics=metrics, demand_at=case.demand_at, quota=case.quota)
    return dep, spec, obs


HELD_OUT = Memory(out_since=NOW - 31)


def gpu_quota(max_gpus: int, used_gpus: int, gpus_per_replica: int) -> QuotaView:
    return QuotaView("acme", TenantQuota(tenant="acme", max_gpus=max_gpus), Amount(used_gpus),
                     Amount(gpus_per_replica))
HELD_IN = Memory(in_since=NOW - 61)
IDLE = Memory(in_since=NOW - 61, idle_since=NOW - 301, finished=10)

CASES = [
    # scale out
    Case("queue high held long enough", 2, [30, 25], ("scale_out", 3, "queue_high"), memory=HELD_OUT,
         reason="for 31s"),
    Case("queue high not yet held", 2, [30, 25], ("hold", 2, "queue_high_pending"), memory=Memory(out_since=NOW - 10),
         reason="for 10s of 30s"),
    Case("queue high starts the timer", 2, [30, 25], ("hold", 2, "queue_high_pending")),
    Case("queue high with zero hold time", 1, [30], ("scale_out", 2, "queue_high"), spec={"scale_out_seconds": 0}),
    Case("mean over replicas is what counts", 2, [38, 0], ("hold", 2, "steady"), memory=HELD_OUT),
    Case("ttft high scales out at once", 2, [5, 5], ("scale_out", 3, "ttft_high"),
         spec={"scale_out_ttft_ms": 500}, ttft_s=[0.9, 0.7], reason="800ms"),
    Case("ttft below threshold holds", 2, [5, 5], ("hold", 2, "steady"),
         spec={"scale_out_ttft_ms": 500}, ttft_s=[0.3, 0.2]),
    Case("at max_replicas holds", 4, [30, 30, 30, 30], ("hold", 4, "at_max"), memory=HELD_OUT,
         reason="max_replicas 4"),
    Case("cooldown after a scale-out", 2, [30, 30], ("hold", 2, "cooldown"),
         memory=Memory(out_since=NOW - 31, last_scale_at=NOW - 20, last_action="scale_out"), reason="cooldown 60s"),
    Case("cooldown over", 2, [30, 30], ("scale_out", 3, "queue_high"),
         memory=Memory(out_since=NOW - 31, last_scale_at=NOW - 61, last_action="scale_out")),
    Case("a scale-in does not block a scale-out", 2, [30, 30], ("scale_out", 3, "queue_high"),
         memory=Memory(out_since=NOW - 31, last_scale_at=NOW - 5, last_action="scale_in")),
    Case("quota refuses the scale-out", 2, [30, 30], ("hold", 2, "quota"), memory=HELD_OUT,
         quota=gpu_quota(4, 4, 2), reason="tenant 'acme' GPU quota is 4"),
    Case("the CPU quota refuses the scale-out", 2, [30, 30], ("hold", 2, "quota"), memory=HELD_OUT,
         quota=QuotaView("acme", TenantQuota(tenant="acme", max_gpus=100, max_cpu=16), Amount(2, 16, 64),
                         Amount(1, 8, 32)), reason="tenant 'acme' CPU quota is 16 (max_cpu); it uses 16"),
    Case("the memory quota refuses the scale-out", 2, [30, 30], ("hold", 2, "quota"), memory=HELD_OUT,
         quota=QuotaView("acme", TenantQuota(tenant="acme", max_memory_gib=80), Amount(2, 16, 64),
                         Amount(1, 8, 32)), reason="tenant 'acme' memory (GiB) quota is 80 (max_memory_gib)"),
    Case("quota with room", 2, [30, 30], ("scale_out", 3, "queue_high"), memory=HELD_OUT,
         quota=gpu_quota(6, 4, 2)),
    Case("replicas still starting: hold", 2, [30], ("hold", 2, "starting"), memory=HELD_OUT, starting=1),
    # scale in
    Case("queue low held long enough", 3, [0, 1, 0], ("scale_in", 2, "queue_low"), memory=HELD_IN),
    Case("queue low not yet held", 3, [0, 1, 0], ("hold", 3, "queue_low_pending"), memory=Memory(in_since=NOW - 30)),
    Case("at min_replicas holds", 1, [0], ("hold", 1, "at_min"), memory=HELD_IN, reason="min_replicas 1"),
    Case("scale_to_zero goes to 0 once idle long enough", 1, [0], ("scale_in", 0, "queue_low"), memory=IDLE,
         spec={"scale_to_zero": True}, finished=[10]),
    Case("scale_to_zero from min goes straight to 0", 2, [0, 0], ("scale_in", 0, "queue_low"), memory=IDLE,
         spec={"scale_to_zero": True, "min_replicas": 2}, finished=[4, 6]),
    # idle means idle: running counts, and scale to zero needs no request for the idle time
    Case("a generating replica with nothing queued is busy", 2, [0, 0], ("hold", 2, "steady"), memory=HELD_IN,
         running=[3, 2], reason="running + waiting"),
    Case("running plus waiting below the threshold scales in", 2, [0, 0], ("scale_in", 1, "queue_low"),
         memory=HELD_IN, running=[1, 0]),
    Case("not to zero while a request runs", 1, [0], ("hold", 1, "not_idle"), memory=HELD_IN,
         spec={"scale_to_zero": True, "scale_in_queue": 2}, running=[1], reason="1 requests running"),
    Case("not to zero right after a request finished", 1, [0], ("hold", 1, "not_idle"), memory=IDLE,
         spec={"scale_to_zero": True}, finished=[11], reason="finished since the last look"),
    Case("not to zero before the idle time", 1, [0], ("hold", 1, "not_idle"),
         memory=Memory(in_since=NOW - 61, idle_since=NOW - 100, finished=10), spec={"scale_to_zero": True},
         finished=[10], reason="idle for 100s of 300s"),
    Case("cooldown blocks scale-in after a scale-out", 3, [0, 0, 0], ("hold", 3, "cooldown"),
         memory=Memory(in_since=NOW - 61, last_scale_at=NOW - 30, last_action="scale_out")),
    Case("stale metrics never scale in", 3, [0, 0, 0], ("hold", 3, "stale_metrics"), memory=HELD_IN,
         ages=[1, 45, 1], reason="d-1"),
    Case("missing metrics never scale in", 3, [0, None, 0], ("hold", 3, "stale_metrics"), memory=HELD_IN,
         reason="d-1"),
    Case("failed scrape never scales in", 2, [0, 0], ("hold", 2, "stale_metrics"), memory=HELD_IN,
         ok=[True, False]),
    Case("no metrics at all holds", 2, [None, None], ("hold", 2, "stale_metrics"), memory=HELD_IN),
    Case("queue between thresholds is steady", 2, [10, 10], ("hold", 2, "steady")),
    # bounds, cold start, disabled
    Case("below min goes up to min", 1, [0], ("scale_out", 2, "below_min"), spec={"min_replicas": 2}),
    Case("below min refused by quota", 1, [0], ("hold", 1, "quota"), spec={"min_replicas": 2},
         quota=gpu_quota(1, 1, 1)),
    Case("above max goes down to max", 6, [0] * 6, ("scale_in", 4, "above_max")),
    Case("zero without scale_to_zero goes to min", 0, [], ("scale_out", 1, "below_min")),
    Case("parked at zero", 0, [], ("hold", 0, "idle_at_zero"), spec={"scale_to_zero": True}),
    Case("demand wakes from zero", 0, [], ("scale_out", 1, "cold_start"), spec={"scale_to_zero": True},
         demand_at=NOW - 1, memory=Memory(last_scale_at=NOW - 100, last_action="scale_in")),
    Case("demand wakes to min_replicas", 0, [], ("scale_out", 3, "cold_start"),
         spec={"scale_to_zero": True, "min_replicas": 3}, demand_at=NOW - 1),
    Case("demand ignores the cooldown", 0, [], ("scale_out", 1, "cold_start"), spec={"scale_to_zero": True},
         demand_at=NOW - 1, memory=Memory(last_scale_at=NOW - 5, last_action="scale_in")),
    Case("demand from before the scale to zero is old", 0, [], ("hold", 0, "idle_at_zero"),
         spec={"scale_to_zero": True}, demand_at=NOW - 100, memory=Memory(last_scale_at=NOW - 50)),
    # an operator parked it at zero after the call (the autoscaler never acted): nobody waits
    Case("demand from before an operator's scale to zero is old", 0, [], ("hold", 0, "idle_at_zero"),
         spec={"scale_to_zero": True}, demand_at=NOW - 100, scaled_at=NOW - 50),
    Case("demand after an operator's scale to zero wakes", 0, [], ("scale_out", 1, "cold_start"),
         spec={"scale_to_zero": True}, demand_at=NOW - 1, scaled_at=NOW - 50,
         memory=Memory(last_scale_at=NOW - 500, last_action="scale_out")),
    Case("cold start refused by quota", 0, [], ("hold", 0, "quota"), spec={"scale_to_zero": True},
         demand_at=NOW - 1, quota=gpu_quota(0, 0, 1)),
    Case("disabled holds", 3, [50, 50, 50], ("hold", 3, "disabled"), spec={"enabled": False}, memory=HELD_OUT),
    Case("deleting holds", 3, [50, 50, 50], ("hold", 3, "deleting"), phase="Deleting", memory=HELD_OUT),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case):
    dep, spec, obs = build(case)
    d = decide(dep, spec, obs, NOW, case.memory)
    assert (d.action, d.replicas, d.code) == case.expect, d.reason
    assert case.reason in d.reason
    assert d.memory.last_code == case.expect[2]
    if d.action != "hold":
        assert (d.memory.last_scale_at, d.memory.last_action) == (NOW, d.action)
        assert d.memory.out_since is None and d.memory.in_since is None  # conditions must hold anew


def test_no_spec_holds():
    dep = InferenceDeployment(name="d", model="m", profile="p", replicas=2)
    d = decide(dep, None, Observations(), NOW)
    assert (d.action, d.replicas, d.code) == ("hold", 2, "disabled")


def test_timers_carry_between_ticks_and_reset_when_the_condition_breaks():
    """A queue above the threshold starts the timer, keeps it while it holds, and a dip restarts it."""
    spec = AutoscalingSpec(**SPEC)
    mem = Memory()
    for t, q, expect in [(0, 30, "queue_high_pending"), (15, 30, "queue_high_pending"),
                         (20, 10, "steady"), (25, 30, "queue_high_pending"), (50, 30, "queue_high_pending"),
                         (55, 30, "queue_high")]:
        dep, _, obs = build(Case("t", 1, [q], ("", 0, "")))
        obs = Observations(replicas=obs.replicas, metrics={k: v.model_copy(update={"scraped_at": NOW + t - 1})
                                                           for k, v in obs.metrics.items()})
        d = decide(dep, spec, obs, NOW + t, mem)
        assert d.code == expect, (t, d.reason)
        mem = d.memory
    assert d.action == "scale_out" and d.replicas == 2


def test_stale_metrics_restart_the_scale_in_timer():
    spec = AutoscalingSpec(**SPEC)
    dep, _, obs = build(Case("s", 2, [0, 0], ("", 0, ""), ages=[1, 40]))
    d = decide(dep, spec, obs, NOW, HELD_IN)
    assert d.memory.in_since is None and d.signal.stale == ("d-1",)


def test_explain_signal_reports_how_long_conditions_held():
    dep, spec, obs = build(Case("e", 2, [30, 30], ("", 0, "")))
    d = decide(dep, spec, obs, NOW, Memory(out_since=NOW - 12))
    assert d.signal.queue_depth == 30 and d.signal.out_held_s == 12 and d.signal.in_held_s == 0
    assert d.signal.ready == 2 and d.signal.fresh == 2


def test_spec_refuses_bounds_that_would_flap():
    with pytest.raises(ValueError, match="min_replicas"):
        AutoscalingSpec(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError, match="flap"):
        AutoscalingSpec(scale_in_queue=30, scale_out_queue=20)


def test_a_new_hold_is_dated_by_the_scrape_and_says_when_it_is_due():
    dep, spec, obs = build(Case("d", 2, [30, 25], ("", 0, ""), ages=[4, 2]))
    d = decide(dep, spec, obs, NOW)
    assert d.code == "queue_high_pending" and d.memory.out_since == NOW - 2  # the newest scrape
    assert d.due_at == NOW - 2 + 30
    dep, spec, obs = build(Case("i", 2, [0, 0], ("", 0, "")))
    d = decide(dep, spec, obs, NOW, Memory(in_since=NOW - 20))
    assert d.code == "queue_low_pending" and d.due_at == NOW - 20 + 60
