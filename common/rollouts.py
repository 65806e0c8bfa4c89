"""Deployment revisions and rollout records (stored as JSON under common.keyspace).

A revision is the immutable template of a deployment's replicas (model, profile, engine args)
plus who wrote it, when and why. A rollout moves a deployment from one revision to another with
one of three strategies; its record is the whole state the planner needs, so a restart (or a new
leader) continues the phase it finds. Validation messages name the field that is wrong.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.schemas import Template

STRATEGIES = ("rolling", "canary", "blue-green")
Strategy = Literal["rolling", "canary", "blue-green"]
RolloutPhase = Literal["Progressing", "Paused", "RollingBack", "Succeeded", "RolledBack"]
TERMINAL_PHASES = ("Succeeded", "RolledBack")
class Revision(BaseModel):
    """One immutable revision of a deployment's template."""

    model_config = ConfigDict(extra="ignore")
    deployment: str
    revision: int = Field(..., ge=1)
    template: Template
    created_at: float = Field(default_factory=time.time)
    who: str = ""
    reason: str = ""
    superseded_at: float | None = None  # set once a later revision replaced every replica of it


class CanaryStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    percent: int = Field(..., ge=1, le=100, description="share of new connections to the new revision")
    secs: float | None = Field(None, ge=0, le=7 * 86400, description="hold time; None on the last step")


DEFAULT_STEPS = [CanaryStep(percent=5, secs=300), CanaryStep(percent=20, secs=600),
                 CanaryStep(percent=50, secs=900), CanaryStep(percent=100)]


class Thresholds(BaseModel):
    """Automatic pause and rollback of a canary when its window breaches one of these."""

    model_config = ConfigDict(extra="forbid")
    error_rate_max: float = Field(0.05, ge=0, le=1, description="failed / finished requests of the new set")
    ttft_ms_max: float | None = Field(5000.0, gt=0, description="mean time to first token of the new set")
    min_requests: int = Field(20, ge=1, le=1_000_000, description="requests in the window before judging")


class RolloutRequest(BaseModel):
    """POST /api/ai/deployments/{name}/rollouts."""

    model_config = ConfigDict(extra="forbid")
    to_revision: int | None = Field(None, ge=1, description="default: the newest revision")
    strategy: Strategy = "rolling"
    max_surge: int = Field(1, ge=0, le=64)
    max_unavailable: int = Field(0, ge=0, le=64)
    min_healthy_secs: float = Field(30.0, ge=0, le=86400)
    steps: list[CanaryStep] | None = None
    canary_percent: int | None = Field(None, ge=1, le=99, description="one canary step at this share, then 100")
    thresholds: Thresholds = Field(default_factory=Thresholds)
    rollback_window_secs: float = Field(600.0, ge=0, le=7 * 86400, description="blue/green: old set kept")
    auto_promote: bool = Field(False, description="blue/green: switch as soon as the new set is ready")
    reason: str = Field("", max_length=500)

    @model_validator(mode="after")
    def _shape(self) -> RolloutRequest:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("max_surge and max_unavailable cannot both be 0 (the rollout could never move)")
        if self.steps is not None and self.canary_percent is not None:
            raise ValueError("give steps or canary_percent, not both")
        if (self.steps is not None or self.canary_percent is not None) and self.strategy != "canary":
            raise ValueError(f"steps and canary_percent apply to the canary strategy, not {self.strategy}")
        if self.steps is not None:
            check_steps(self.steps)
        return self

    def canary_steps(self) -> list[CanaryStep]:
        if self.canary_percent is not None:
            return [CanaryStep(percent=self.canary_percent, secs=300), CanaryStep(percent=100)]
        return list(self.steps) if self.steps is not None else [s.model_copy() for s in DEFAULT_STEPS]


def check_steps(steps: list[CanaryStep]) -> list[CanaryStep]:
    if not steps or len(steps) > 20:
        raise ValueError("steps needs 1-20 entries")
    percents = [s.percent for s in steps]
    if percents != sorted(set(percents)):
        raise ValueError(f"step percents must rise strictly, got {percents}")
    if percents[-1] != 100:
        raise ValueError(f"the last step must be 100 percent, got {percents[-1]}")
    return steps


class WindowBase(BaseModel):
    """Cumulative engine counters of one replica when the current canary window began."""

    finished: float = 0.0
    failed: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: float = 0.0


class Rollout(BaseModel):
    """The stored rollout record; the planner's whole memory."""

    model_config = ConfigDict(extra="ignore")
    id: int
    deployment: str
    strategy: Strategy
    from_revision: int
    to_revision: int
    replicas: int = Field(..., ge=0, description="replicas the deployment wanted when the rollout began")
    max_surge: int = 1
    max_unavailable: int = 0
    min_healthy_secs: float = 30.0
    steps: list[CanaryStep] = Field(default_factory=list)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    rollback_window_secs: float = 600.0
    auto_promote: bool = False
    phase: RolloutPhase = "Progressing"
    step: int = 0
    step_started_at: float | None = None  # when the current step's share went live
    switched: bool = False  # blue/green: weights moved to the new set
    promote: bool = False  # operator asked to finish now
    old_target: int = 0  # replicas wanted of from_revision
    new_target: int = 0  # replicas wanted of to_revision
    share: int | None = None  # percent of new connections to the new set; None = no split
    window: dict[str, WindowBase] = Field(default_factory=dict)
    message: str = ""
    rollback_reason: str = ""  # why it rolled back (a breach names the threshold), kept to the end
    reason: str = ""
    who: str = ""
    started_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    finished_at: float | None = None

    @property
    def active(self) -> bool:
        return self.phase not in TERMINAL_PHASES
