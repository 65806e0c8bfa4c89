"""The autoscaler's decision for one deployment: a pure function of spec, readings, memory and now.

``decide(deployment, spec, observations, now, memory)`` returns a Decision: scale_out, scale_in
or hold, the target replica count, a reason for people, a stable ``code`` for scripts, the signal
it read and the memory to keep for the next tick (when each condition started to hold, when the
last change was made). Rules, in order:

  - disabled (or no spec), or the deployment is being deleted: hold, nothing changes;
  - cold start: zero desired replicas and a gateway call recorded after the replica count last
    changed (status.scaled_at: an operator's scale or drain, or this autoscaler) wakes it to
    max(1, min_replicas), ignoring the cooldown (a caller is waiting); a call from before an
    operator parked it at zero waits for nothing;
  - bounds: below min_replicas (and not parked at 0 by scale_to_zero) goes up to min; above
    max_replicas goes down to max;
  - while a replica is still starting (desired > ready), hold: its load is not measurable yet;
  - scale out by one when the mean queue of the ready replicas with fresh metrics has been above
    scale_out_queue for scale_out_seconds, or their mean TTFT is above scale_out_ttft_ms, and
    desired < max_replicas; not within cooldown_seconds of the previous scale-out;
  - scale in by one (with scale_to_zero, from min_replicas straight to 0) when the mean work
    (requests running + waiting) per ready replica has been below scale_in_queue for
    scale_in_seconds, desired is above min_replicas (above 0 with scale_to_zero), and every ready
    replica has an ok scrape younger than FRESH_S; not within cooldown_seconds of any previous
    change. Stale or missing metrics never scale in: the timer restarts and the reason names the
    replicas. A replica generating with nothing queued is busy, not idle;
  - scale to zero also needs idleness: nothing running or waiting on any replica, and no request
    finished on any (the engines' finished-request counters did not move), for
    scale_to_zero_idle_seconds;
  - any scale-out (bounds and cold start included) first passes the tenant's quota check (GPUs, CPU,
    memory: controlplane.tenancy.quotas.check); a refusal is a hold with code "quota" and the numbers.
"Queue depth" is the mean number of waiting requests per ready replica (docs/autoscaling.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from common.schemas import AutoscalingSpec, InferenceDeployment, Replica, ReplicaObservation, TenantQuota
from controlplane.tenancy.quotas import UNKNOWN_PROFILE, Amount
from controlplane.tenancy.quotas import check as quota_check

FRESH_S = 30.0  # the routing controller's eligibility window: an older scrape is stale

Action = Literal["scale_out", "scale_in", "hold"]


@dataclass(frozen=True)
class QuotaView:
    """The deployment's tenant quota as the check needs it."""

    tenant: str | None
    quota: TenantQuota | None
    used: Amount  # by the tenant's deployments, this one included at its desired count
    per_replica: Amount = UNKNOWN_PROFILE


@dataclass(frozen=True)
class Observations:
    replicas: Sequence[Replica] = ()
    metrics: Mapping[str, ReplicaObservation] = field(default_factory=dict)
    demand_at: float | None = None  # last gateway call that found no ready replica
    quota: QuotaView | None = None


@dataclass(frozen=True)
class Memory:
    """What the autoscaler keeps between ticks (stored, so a restart or a new leader continues)."""

    out_since: float | None = None  # queue above scale_out_queue since
    in_since: float | None = None  # queue below scale_in_queue, with fresh metrics, since
    last_scale_at: float | None = None
    last_action: str | None = None  # scale_out | scale_in
    last_code: str = ""  # the previous decision's code: events are recorded on change only
    idle_since: float | None = None  # nothing running, waiting or finishing on any replica since
    finished: float | None = None  # the replicas' finished-request counters summed at the last tick


@dataclass(frozen=True)
class Signal:
    desired: int
    ready: int
    fresh: int
    queue_depth: float | None  # mean waiting per ready replica with fresh metrics
    ttft_ms: float | None
    stale: tuple[str, ...]  # ready replicas without a fresh ok scrape
    out_held_s: float
    in_held_s: float
    newest_scrape: float | None = None  # the latest scrape time among the fresh readings
    work: float | None = None  # mean running + waiting per ready replica with fresh metrics
    running: float = 0.0  # requests running on the fresh replicas, summed
    finished: float | None = None  # their finished-request counters, summed (None: not reported)


@dataclass(frozen=True)
class Decision:
    action: Action
    replicas: int
    code: str
    reason: str
    signal: Signal
    memory: Memory
    due_at: float | None = None  # when a condition now holding has held long enough (the next look)

    @property
    def summary(self) -> str:
        verb = {"scale_out": "scale out", "scale_in": "scale in", "hold": "hold"}[self.action]
        return f"{verb} to {self.replicas}: {self.reason}" if self.action != "hold" else f"hold: {self.reason}"


def _fresh(obs: ReplicaObservation | None, now: float) -> bool:
    return obs is not None and obs.ok and now - obs.scraped_at <= FRESH_S


def read_signal(deployment: InferenceDeployment, obs: Observations, now: float, memory: Memory) -> Signal:
    ready = [r for r in obs.replicas if r.ready and not r.draining and r.phase != "Deleting"]
    fresh = [obs.metrics[r.replica_id] for r in ready if _fresh(obs.metrics.get(r.replica_id), now)]
    stale = tuple(sorted(r.replica_id for r in ready if not _fresh(obs.metrics.get(r.replica_id), now)))
    queue = sum(o.queue_depth for o in fresh) / len(fresh) if fresh else None
    ttfts = [o.ttft_p50_s for o in fresh if o.ttft_p50_s is not None]
    ttft_ms = 1000 * sum(ttfts) / len(ttfts) if ttfts else None
    work = sum(o.queue_depth + o.running for o in fresh) / len(fresh) if fresh else None
    counters = [o.finished_total for o in fresh]
    known = [c for c in counters if c is not None]
    finished = sum(known) if counters and len(known) == len(counters) else None
    return Signal(deployment.replicas, len(ready), len(fresh), queue, ttft_ms, stale,
                  now - memory.out_since if memory.out_since is not None else 0.0,
                  now - memory.in_since if memory.in_since is not None else 0.0,
                  max((o.scraped_at for o in fresh), default=None), work,
                  sum(o.running for o in fresh), finished)


def _timers(spec: AutoscalingSpec, sig: Signal, memory: Memory, now: float) -> Memory:
    """A condition that starts holding is dated by the newest scrape it was read from (when the
    queue was seen, not when this tick ran); never earlier than the queue could have crossed."""
    seen = min(now, sig.newest_scrape) if sig.newest_scrape is not None else now
    out_cond = sig.queue_depth is not None and sig.queue_depth > spec.scale_out_queue
    in_cond = sig.work is not None and sig.work < spec.scale_in_queue and not sig.stale
    idle = (sig.work == 0 and not sig.stale and sig.fresh == sig.ready
            and (sig.finished is None or memory.finished is None or sig.finished == memory.finished))
    return replace(memory,
                   out_since=(memory.out_since if memory.out_since is not None else seen) if out_cond else None,
                   in_since=(memory.in_since if memory.in_since is not None else seen) if in_cond else None,
                   idle_since=(memory.idle_since if memory.idle_since is not None else seen) if idle else None,
                   finished=sig.finished)


def _fmt(x: float | None, unit: str = "") -> str:
    return "n/a" if x is None else f"{x:.4g}{unit}"


def decide(deployment: InferenceDeployment, spec: AutoscalingSpec | None, observations: Observations,
           now: float, memory: Memory = Memory()) -> Decision:
    sig0 = read_signal(deployment, observations, now, memory)
    desired = deployment.replicas

    def result(action: Action, target: int, code: str, reason: str, mem: Memory) -> Decision:
        if action != "hold":
            mem = replace(mem, out_since=None, in_since=None, last_scale_at=now, last_action=action)
        mem = replace(mem, last_code=code)
        sig = read_signal(deployment, observations, now, mem) if action == "hold" else sig0
        return Decision(action, target, code, reason, sig, mem)

    if spec is None or not spec.enabled:
        return result("hold", desired, "disabled", "autoscaling is disabled", memory)
    if deployment.status.phase == "Deleting":
        return result("hold", desired, "deleting", "the deployment is being deleted", memory)

    mem = _timers(spec, sig0, memory, now)
    quota = observations.quota

    def out_to(target: int, code: str, reason: str) -> Decision:
        if quota is not None:
            refusal = quota_check(quota.tenant, quota.quota, quota.used, quota.per_replica.times(target - desired))
            if refusal is not None:
                return result("hold", desired, "quota", f"not scaling out to {target} ({reason}): "
                              f"{refusal.message}", mem)
        return result("scale_out", target, code, reason, mem)

    floor = 0 if spec.scale_to_zero else spec.min_replicas
    wake = max(1, spec.min_replicas)
    # The count's last change, whoever made it (status.scaled_at; the memory's own for a record
    # from before that was stamped): a call recorded before it waits for nothing now.
    changed_at = max((t for t in (deployment.status.scaled_at, memory.last_scale_at) if t is not None), default=None)
    if desired == 0 and observations.demand_at is not None and (
            changed_at is None or observations.demand_at > changed_at):
        return out_to(wake, "cold_start", f"a call arrived with 0 replicas; starting {wake}")
    if desired < spec.min_replicas and not (desired == 0 and spec.scale_to_zero):
        return out_to(spec.min_replicas, "below_min", f"{desired} is below min_replicas {spec.min_replicas}")
    if desired > spec.max_replicas:
        return result("scale_in", spec.max_replicas, "above_max",
                      f"{desired} is above max_replicas {spec.max_replicas}", mem)
    if desired == 0:
        return result("hold", 0, "idle_at_zero", "scaled to zero; the next call through the gateway starts a replica",
                      mem)
    if sig0.ready < desired:
        return result("hold", desired, "starting", f"{sig0.ready}/{desired} replicas ready; waiting for the rest "
                      "before judging load", mem)

    queue_note = f"queue {_fmt(sig0.queue_depth)}"
    work_note = f"work (running + waiting) {_fmt(sig0.work)}"
    out_held = now - mem.out_since if mem.out_since is not None else 0.0
    queue_out = mem.out_since is not None and out_held >= spec.scale_out_seconds
    ttft_out = (spec.scale_out_ttft_ms is not None and sig0.ttft_ms is not None
                and sig0.ttft_ms > spec.scale_out_ttft_ms)
    if queue_out or ttft_out:
        why = (f"{queue_note} > {spec.scale_out_queue:g} for {out_held:.0f}s (>= {spec.scale_out_seconds:g}s)"
               if queue_out else f"mean TTFT {sig0.ttft_ms:.0f}ms > {spec.scale_out_ttft_ms:g}ms")
        if desired >= spec.max_replicas:
            return result("hold", desired, "at_max", f"{why}, but already at max_replicas {spec.max_replicas}", mem)
        since_out = now - memory.last_scale_at if memory.last_scale_at is not None else None
        if memory.last_action == "scale_out" and since_out is not None and since_out < spec.cooldown_seconds:
            return result("hold", desired, "cooldown", f"{why}, but the last scale-out was {since_out:.0f}s ago "
                          f"(cooldown {spec.cooldown_seconds:g}s)", mem)
        return out_to(desired + 1, "queue_high" if queue_out else "ttft_high", why)
    if mem.out_since is not None:
        return replace(result("hold", desired, "queue_high_pending", f"{queue_note} > {spec.scale_out_queue:g} for "
                      f"{out_held:.0f}s of {spec.scale_out_seconds:g}s", mem),
                       due_at=mem.out_since + spec.scale_out_seconds)

    if sig0.stale:
        return result("hold", desired, "stale_metrics", f"not scaling in: no fresh metrics (ok scrape within "
                      f"{FRESH_S:g}s) for {', '.join(sig0.stale)}", mem)
    if mem.in_since is None:
        return result("hold", desired, "steady", f"{work_note} is not below {spec.scale_in_queue:g} "
                      f"({queue_note} <= {spec.scale_out_queue:g})", mem)
    in_held = now - mem.in_since
    if in_held < spec.scale_in_seconds:
        return replace(result("hold", desired, "queue_low_pending", f"{work_note} < {spec.scale_in_queue:g} "
                              f"for {in_held:.0f}s of {spec.scale_in_seconds:g}s", mem),
                       due_at=mem.in_since + spec.scale_in_seconds)
    if desired <= floor:
        return result("hold", desired, "at_min", f"{work_note} < {spec.scale_in_queue:g}, but already at "
                      f"{'0 (scale_to_zero)' if floor == 0 else f'min_replicas {floor}'}", mem)
    since = now - memory.last_scale_at if memory.last_scale_at is not None else None
    if since is not None and since < spec.cooldown_seconds:
        return result("hold", desired, "cooldown", f"{work_note} < {spec.scale_in_queue:g}, but the last change "
                      f"was {since:.0f}s ago (cooldown {spec.cooldown_seconds:g}s)", mem)
    # With scale_to_zero the next step below min_replicas is 0 (a count between would be raised
    # straight back to min by the bounds rule).
    target = 0 if spec.scale_to_zero and desired - 1 < spec.min_replicas else desired - 1
    if target == 0:
        idle_held = now - mem.idle_since if mem.idle_since is not None else None
        if idle_held is None or idle_held < spec.scale_to_zero_idle_seconds:
            why = (f"{sig0.running:g} requests running" if sig0.running else
                   "requests waiting" if sig0.work else "a request finished since the last look"
                   if idle_held is None else f"idle for {idle_held:.0f}s of {spec.scale_to_zero_idle_seconds:g}s")
            out = result("hold", desired, "not_idle", f"not scaling to zero: {why}", mem)
            if idle_held and mem.idle_since is not None:
                return replace(out, due_at=mem.idle_since + spec.scale_to_zero_idle_seconds)
            return out
    return result("scale_in", target, "queue_low",
                  f"{work_note} < {spec.scale_in_queue:g} for {in_held:.0f}s (>= {spec.scale_in_seconds:g}s)", mem)
