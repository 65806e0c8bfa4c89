"""Token and cost budgets per tenant or per API key, per UTC day or calendar month (UTC).

A budget (/fabric/budgets/{name}) names what it covers (a tenant, a key, or a key within a
tenant), what it counts (``tokens``: input + output; ``cost``: the price sheet's money,
common.prices), its period, its limit, the thresholds that notify (percent; 80 and 100 by
default) and what happens at 100%: ``refuse`` (the gateway answers new calls 429
``budget_exceeded`` naming the budget until the period ends) or ``notify`` (calls go on).

Spend is a counter per budget (/fabric/counters/budget/{name}, "<period start> <amount>"; cost in
micro-units so it stays an integer) added to by every gateway in its usage ledger's batches with
one compare-and-swap per budget per batch (common.records.counters.period_reserve), so several gateways
add up exactly. The batch that takes a counter across a threshold raises one notification whose
id names the budget, period and threshold (common.notifications: created if absent), so however
many gateways see it, it is sent once.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Literal

from pydantic import Field, field_validator, model_validator

from common.schemas import Spec, check_name, tenant_name

Metric = Literal["tokens", "cost"]
Period = Literal["day", "month"]
Action = Literal["refuse", "notify"]
MICRO = 1_000_000  # cost counters hold millionths of the currency


class Budget(Spec):
    name: str = Field(..., description="a DNS label")
    tenant: str | None = Field(None, description="the tenant whose calls count")
    key: str | None = Field(None, description="the API key id whose calls count", max_length=128)
    metric: Metric = "tokens"
    period: Period = "month"
    limit: float = Field(..., gt=0, le=1e15, description="tokens, or money in the price sheet's currency")
    thresholds: list[int] = Field(default_factory=lambda: [80, 100], description="percent of the limit that notify")
    action: Action = Field("notify", description="at 100%: refuse new calls (429) or only notify")
    updated_at: float = Field(default_factory=time.time)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_name(v, "budget name")

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str | None) -> str | None:
        return None if v is None else tenant_name(v)

    @field_validator("thresholds")
    @classmethod
    def _thresholds(cls, v: list[int]) -> list[int]:
        if not v or len(v) > 10 or any(not 1 <= t <= 1000 for t in v):
            raise ValueError("1-10 thresholds, each a percent from 1 to 1000")
        return sorted(set(v))

    @model_validator(mode="after")
    def _scoped(self) -> Budget:
        if self.tenant is None and self.key is None:
            raise ValueError("a budget covers a tenant, a key, or both: give tenant or key")
        return self

    def covers(self, tenant: str | None, key: str | None) -> bool:
        return ((self.tenant is None or self.tenant == tenant) and (self.key is None or self.key == key))

    def units(self) -> int:
        """The limit in counter units (tokens, or cost in micro-units)."""
        return int(self.limit * MICRO) if self.metric == "cost" else int(self.limit)


def period_bounds(period: str, now: float) -> tuple[int, int]:
    """[start, end) of the UTC day or calendar month containing ``now``."""
    if period == "day":
        start = int(now // 86400) * 86400
        return start, start + 86400
    d = datetime.fromtimestamp(now, tz=timezone.utc)
    start = int(datetime(d.year, d.month, 1, tzinfo=timezone.utc).timestamp())
    return start, start + calendar.monthrange(d.year, d.month)[1] * 86400


def amount(budget: Budget, tokens: int, cost: float) -> int:
    return int(round(cost * MICRO)) if budget.metric == "cost" else tokens


def crossed(before: int, after: int, budget: Budget) -> list[int]:
    """The thresholds (percent) that an addition from ``before`` to ``after`` passed or reached."""
    units = budget.units()
    return [t for t in budget.thresholds if before * 100 < t * units <= after * 100]


def exhausted(budgets: Iterable[Budget], spend: dict[str, int], tenant: str | None, key: str | None) -> Budget | None:
    """Pure: the first refusing budget covering the call that is at or over its limit."""
    for b in budgets:
        if b.action == "refuse" and b.covers(tenant, key) and spend.get(b.name, 0) >= b.units():
            return b
    return None


def event_id(budget: Budget, start: int, threshold: int) -> str:
    return f"budget-{budget.name}-{start}-{threshold}"
