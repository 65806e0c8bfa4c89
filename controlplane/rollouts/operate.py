"""Operator actions on a rollout record (pure): pause, resume, promote, rollback, and the record a
start request becomes. Each returns the new record or raises Conflict naming why it cannot.

  pause     Progressing -> Paused (targets and share stay where they are)
  resume    Paused -> Progressing; the current step's clock and window start again
  promote   canary: jump to the last step (100 %); blue/green: switch as soon as the new set is
            ready, or, once switched, end the rollback window now; rolling: stop waiting for
            min_healthy_secs. Allowed while Paused too (it also resumes).
  rollback  Progressing or Paused -> RollingBack: the new set's share drops to 0 at once
"""

from __future__ import annotations

from common.errors import Conflict, InvalidInput
from common.rollouts import Rollout, RolloutRequest
from controlplane.rollouts.plan import initial_targets

ACTIONS = ("pause", "resume", "promote", "rollback")


def start(req: RolloutRequest, *, rollout_id: int, deployment: str, from_revision: int, to_revision: int,
          replicas: int, who: str, now: float) -> Rollout:
    if to_revision == from_revision:
        raise Conflict(f"deployment {deployment!r} already runs revision {to_revision}", code="same_revision")
    if req.strategy == "rolling" and req.max_surge == 0 and replicas <= 1:
        raise InvalidInput("a rolling update of one replica needs max_surge >= 1 (the last old replica "
                           "stays until a new one is healthy)", code="invalid_rollout")
    rec = Rollout(id=rollout_id, deployment=deployment, strategy=req.strategy, from_revision=from_revision,
                  to_revision=to_revision, replicas=replicas, max_surge=req.max_surge,
                  max_unavailable=req.max_unavailable, min_healthy_secs=req.min_healthy_secs,
                  steps=req.canary_steps() if req.strategy == "canary" else [], thresholds=req.thresholds,
                  rollback_window_secs=req.rollback_window_secs, auto_promote=req.auto_promote,
                  reason=req.reason, who=who, started_at=now, updated_at=now,
                  message=f"starting {req.strategy} rollout to revision {to_revision}")
    return initial_targets(rec)


def operate(rec: Rollout, action: str, now: float) -> Rollout:
    if action not in ACTIONS:
        raise InvalidInput(f"action {action!r} is unknown; expected one of {', '.join(ACTIONS)}")
    if not rec.active:
        raise Conflict(f"rollout {rec.id} of {rec.deployment!r} is {rec.phase}; start a new rollout instead",
                       code="rollout_finished")
    if rec.phase == "RollingBack":
        raise Conflict(f"rollout {rec.id} of {rec.deployment!r} is rolling back", code="rolling_back")
    out = rec.model_copy(deep=True)
    out.updated_at = now
    if action == "pause":
        if rec.phase == "Paused":
            raise Conflict(f"rollout {rec.id} is already paused", code="already_paused")
        out.phase, out.message = "Paused", "paused by operator"
    elif action == "resume":
        if rec.phase != "Paused":
            raise Conflict(f"rollout {rec.id} is not paused", code="not_paused")
        _resume(out, now)
    elif action == "promote":
        if rec.phase == "Paused":
            _resume(out, now)
        out.promote, out.message = True, "promoted by operator"
    else:
        out.phase, out.message = "RollingBack", "rolling back: asked by operator"
        out.rollback_reason = "asked by operator"
        out.share = 0 if out.share is not None or out.strategy != "rolling" else None
    return out


def _resume(rec: Rollout, now: float) -> None:
    rec.phase, rec.message, rec.window = "Progressing", "resumed by operator", {}
    if rec.step_started_at is not None:
        rec.step_started_at = now
