"""The rollout decision: ``plan_rollout(record, replicas, observations, now) -> actions``. Pure.

The record is the planner's whole memory (phase, step, when the step's share went live, the
window's counter baselines, the replica targets), so a restarted fabricd or a new leader plans
the same next move from the stored record. The actions are: SaveRecord (the advanced record:
targets the reconciler creates/drains replicas to, and the new set's share the routing job turns
into Maglev weights), Event (one per transition, never per tick), Activate (the deployment now
runs the new revision) and Supersede (the old revision has no replica left).

Replica sets: ``from_revision`` replicas are the old set, ``to_revision`` the new one. N is the
replica count the deployment wanted when the rollout began.

  rolling     new_target = min(N, N + max_surge - old_target); old_target drops to
              N - healthy_new - max_unavailable (never rising), where healthy_new counts new
              replicas Ready for min_healthy_secs; it stays >= 1 while no new replica is healthy,
              so a failing new replica never costs the last old one. Done (Succeeded) when N new
              replicas are healthy and no old replica is left.
  canary      step i wants max(1, ceil(N * percent_i / 100)) new replicas next to the N old ones;
              once they are Ready the share becomes percent_i (the step's clock starts then) and
              stays for secs_i; after the last step (100 %) the old set goes. The window (since
              the step went live) sums the new set's engine counters: failed/finished above
              error_rate_max or mean TTFT above ttft_ms_max, once min_requests were seen, pauses
              and rolls back by itself.
  blue-green  the full new set at share 0; promote (or auto_promote) switches the share to 100
              in one save once all N are Ready; the old set stays for rollback_window_secs (a
              second promote ends the window now), then goes. The canary thresholds also judge
              the new set after the switch.
  rollback    share 0 to the new set (old replicas Ready again take everything), old_target = N,
              new replicas go as old ones are Ready; RolledBack when no new replica is left. Old
              replicas are never removed by a rollback.
  pause       targets and share stay; resume restarts the current step's clock and window.
  N = 0       nothing runs: the rollout succeeds at once (the new template applies on scale-up).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.rollouts import Rollout, WindowBase
from common.schemas import Replica, ReplicaObservation


@dataclass(frozen=True)
class SaveRecord:
    record: Rollout


@dataclass(frozen=True)
class Event:
    action: str
    message: str


@dataclass(frozen=True)
class Activate:
    revision: int


@dataclass(frozen=True)
class Supersede:
    revision: int


Action = SaveRecord | Event | Activate | Supersede


@dataclass(frozen=True)
class Window:
    finished: float
    failed: float
    ttft_sum: float
    ttft_count: float

    @property
    def error_rate(self) -> float | None:
        return self.failed / self.finished if self.finished > 0 else None

    @property
    def mean_ttft_ms(self) -> float | None:
        return 1000 * self.ttft_sum / self.ttft_count if self.ttft_count > 0 else None


def live(r: Replica) -> bool:
    return not r.draining and r.phase != "Deleting"


def is_ready(r: Replica) -> bool:
    return live(r) and r.ready


def healthy(r: Replica, now: float, min_healthy_secs: float) -> bool:
    since = r.ready_since if r.ready_since is not None else r.created_at
    return is_ready(r) and now - since >= min_healthy_secs


def _counters(obs: ReplicaObservation | None) -> WindowBase | None:
    if obs is None or not obs.ok or obs.finished_total is None:
        return None
    return WindowBase(finished=obs.finished_total or 0.0, failed=obs.failed_total or 0.0,
                      ttft_sum=obs.ttft_sum_s or 0.0, ttft_count=obs.ttft_count or 0.0)


def window_of(record: Rollout, new: Sequence[Replica], observations: Mapping[str, ReplicaObservation]
              ) -> tuple[dict[str, WindowBase], Window]:
    """The baselines (a replica seen for the first time, or whose counters went back after an
    engine restart, starts from its current counters) and the window's sums since them."""
    bases = dict(record.window)
    sums = [0.0, 0.0, 0.0, 0.0]
    for r in new:
        now_c = _counters(observations.get(r.replica_id))
        if now_c is None:
            continue
        base = bases.get(r.replica_id)
        if base is None or now_c.finished < base.finished or now_c.ttft_count < base.ttft_count:
            bases[r.replica_id] = base = now_c
        for i, name in enumerate(("finished", "failed", "ttft_sum", "ttft_count")):
            sums[i] += getattr(now_c, name) - getattr(base, name)
    return bases, Window(*sums)


def breach(record: Rollout, window: Window) -> str | None:
    t = record.thresholds
    if window.finished >= t.min_requests and window.error_rate is not None and window.error_rate > t.error_rate_max:
        return (f"error rate {window.error_rate:.1%} of the new revision ({window.failed:.0f}/{window.finished:.0f}) "
                f"is above {t.error_rate_max:.1%}")
    if (t.ttft_ms_max is not None and window.ttft_count >= t.min_requests and window.mean_ttft_ms is not None
            and window.mean_ttft_ms > t.ttft_ms_max):
        return f"mean TTFT {window.mean_ttft_ms:.0f} ms of the new revision is above {t.ttft_ms_max:.0f} ms"
    return None


class _Planner:
    def __init__(self, record: Rollout, replicas: Sequence[Replica],
                 observations: Mapping[str, ReplicaObservation], now: float):
        self.before = record
        self.rec = record.model_copy(deep=True)
        self.now = now
        self.obs = observations
        self.new = [r for r in replicas if r.revision == record.to_revision]
        self.old = [r for r in replicas if r.revision == record.from_revision]
        self.actions: list[Action] = []
        self.n = record.replicas

    # -- helpers ----------------------------------------------------------------------------------

    def event(self, action: str, message: str) -> None:
        self.actions.append(Event(action, message))

    def ready_new(self) -> int:
        return sum(1 for r in self.new if is_ready(r))

    def live_old(self) -> int:
        return sum(1 for r in self.old if live(r))

    def start_rollback(self, why: str, automatic: bool) -> None:
        rec = self.rec
        if automatic:
            self.event("paused", f"rollout {rec.id} paused: {why}")
        self.event("rollback", f"rollout {rec.id}: rolling back to revision {rec.from_revision}: {why}")
        rec.phase, rec.message, rec.rollback_reason = "RollingBack", f"rolling back: {why}", why
        self.rolling_back()

    def finish(self) -> None:
        rec = self.rec
        rec.phase, rec.finished_at, rec.share = "Succeeded", self.now, None
        rec.message = f"revision {rec.to_revision} serves all {self.n} replicas"
        self.actions += [Activate(rec.to_revision), Supersede(rec.from_revision)]
        self.event("succeeded", f"rollout {rec.id}: revision {rec.to_revision} active, "
                                f"revision {rec.from_revision} superseded")

    def judge(self) -> bool:
        """Update the window; True (after starting a rollback) when it breaches a threshold."""
        bases, window = window_of(self.rec, self.new, self.obs)
        self.rec.window = bases
        why = breach(self.rec, window)
        if why:
            self.start_rollback(why, automatic=True)
            return True
        return False

    def new_window(self) -> None:
        self.rec.window = {}
        self.rec.window, _ = window_of(self.rec, self.new, self.obs)

    # -- strategies -------------------------------------------------------------------------------

    def rolling(self) -> None:
        rec, n = self.rec, self.n
        min_h = 0.0 if rec.promote else rec.min_healthy_secs
        healthy_new = sum(1 for r in self.new if healthy(r, self.now, min_h))
        old_target = max(0, n - healthy_new - rec.max_unavailable)
        if healthy_new == 0 and n > 0:
            old_target = max(old_target, 1)  # the last old replica stays until a new one is healthy
        rec.old_target = min(rec.old_target, old_target)
        rec.new_target = max(rec.new_target, min(n, n + rec.max_surge - rec.old_target))
        if healthy_new >= n and self.live_old() == 0 and rec.old_target == 0:
            self.finish()
            return
        rec.message = (f"{healthy_new}/{n} new replicas healthy for {min_h:g}s, {self.live_old()} old left; "
                       f"targets {rec.new_target} new, {rec.old_target} old")

    def canary(self) -> None:
        rec, n = self.rec, self.n
        steps = rec.steps
        if rec.promote and rec.step < len(steps) - 1:
            rec.step, rec.step_started_at = len(steps) - 1, None
            self.event("promoted", f"rollout {rec.id}: promoted to the last step (100%)")
        rec.promote = False
        step = steps[rec.step]
        want = n if step.percent >= 100 else max(1, math.ceil(n * step.percent / 100))
        rec.new_target, rec.old_target = max(rec.new_target, want), n
        label = f"step {rec.step + 1}/{len(steps)} ({step.percent}%)"
        if rec.step_started_at is None:
            ready = self.ready_new()
            if ready < want:
                rec.message = f"{label}: waiting for new replicas to be ready ({ready}/{want})"
                if rec.share:  # the previous step's share is still live: keep judging it
                    self.judge()
                return
            rec.share, rec.step_started_at = step.percent, self.now
            self.new_window()
            self.event("step", f"rollout {rec.id} {label}: {step.percent}% of new connections "
                               f"to revision {rec.to_revision}")
        if self.judge():
            return
        held = self.now - rec.step_started_at
        if step.percent >= 100:
            if step.secs is None or held >= step.secs:
                rec.old_target = 0
                if self.live_old() == 0:
                    self.finish()
                    return
                rec.message = f"{label}: removing the old set ({self.live_old()} left)"
                return
        elif step.secs is not None and held >= step.secs:
            rec.step, rec.step_started_at = rec.step + 1, None
            nxt = steps[rec.step]
            self.event("step", f"rollout {rec.id}: step {rec.step} held {step.secs:g}s within thresholds; "
                               f"next {nxt.percent}%")
            self.canary()
            return
        hold = "until promoted" if step.secs is None else f"for {step.secs:g}s"
        rec.message = f"{label}: live, held {hold} while the window stays within thresholds"

    def blue_green(self) -> None:
        rec, n = self.rec, self.n
        rec.new_target = n
        if not rec.switched:
            rec.old_target, rec.share = n, 0
            ready = self.ready_new()
            if ready < n:
                rec.message = f"building the new set at weight 0 ({ready}/{n} ready)"
                return
            if not (rec.promote or rec.auto_promote):
                rec.message = f"new set ready ({n}/{n}) at weight 0; waiting for promote"
                return
            rec.switched, rec.share, rec.step_started_at, rec.promote = True, 100, self.now, False
            self.new_window()
            self.event("switched", f"rollout {rec.id}: all new connections to revision {rec.to_revision} "
                                   f"(one weight save); revision {rec.from_revision} kept "
                                   f"{rec.rollback_window_secs:g}s for rollback")
        if self.judge():
            return
        held = self.now - (rec.step_started_at or self.now)
        if rec.promote or held >= rec.rollback_window_secs:
            if rec.old_target:
                self.event("step", f"rollout {rec.id}: rollback window over; removing revision {rec.from_revision}")
            rec.old_target = 0
            if self.live_old() == 0:
                self.finish()
                return
            rec.message = f"switched; removing the old set ({self.live_old()} left)"
            return
        rec.message = f"switched; old set kept {rec.rollback_window_secs:g}s for rollback (promote ends it now)"

    def rolling_back(self) -> None:
        rec, n = self.rec, self.n
        old_ready = sum(1 for r in self.old if is_ready(r))
        rec.old_target = n
        rec.new_target = min(rec.new_target, max(0, n - old_ready))
        rec.share = 0 if old_ready else None
        rec.promote = False
        left = sum(1 for r in self.new if live(r) or r.phase == "Deleting")
        if left == 0 and rec.new_target == 0:
            rec.phase, rec.finished_at, rec.share = "RolledBack", self.now, None
            rec.message = f"revision {rec.from_revision} serves again ({old_ready}/{n} ready); " \
                          f"rolled back: {rec.rollback_reason or 'asked'}"
            self.actions.append(Activate(rec.from_revision))  # idempotent; undoes a raced finish
            self.event("rolled-back", f"rollout {rec.id}: back on revision {rec.from_revision}")
            return
        rec.message = (f"rolling back: {rec.rollback_reason or 'asked'}; {left} new replicas left, "
                       f"{old_ready}/{n} old ready")

    def run(self) -> list[Action]:
        rec = self.rec
        if not rec.active:
            return []
        if rec.phase == "RollingBack":
            self.rolling_back()
        elif rec.phase == "Paused":
            pass
        elif self.n == 0 and not any(live(r) for r in self.old):
            self.finish()  # nothing runs: the new template applies from the next scale-up
        elif rec.strategy == "rolling":
            self.rolling()
        elif rec.strategy == "canary":
            self.canary()
        else:
            self.blue_green()
        if rec != self.before:
            rec.updated_at = self.now
            self.actions.insert(0, SaveRecord(rec))
        return self.actions


def plan_rollout(record: Rollout, replicas: Sequence[Replica], observations: Mapping[str, ReplicaObservation],
                 now: float) -> list[Action]:
    """The next actions for one rollout (see the module docstring)."""
    return _Planner(record, replicas, observations, now).run()


def initial_targets(record: Rollout) -> Rollout:
    """The targets and share a new record starts from: nothing new yet, the old set whole."""
    share = None if record.strategy == "rolling" else 0
    return record.model_copy(update={"old_target": record.replicas, "new_target": 0, "share": share})
