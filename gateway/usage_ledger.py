"""The gateway's side of the usage ledger (common.usage_ledger) and of budgets (common.budgets).

Every call that authenticated ends with ``record``: one tuple appended to a bounded queue
(gateway.batch_writer; a call never waits for the store, and a full queue drops the record and
counts it in fabric_gateway_usage_dropped_total{reason}). One thread takes the queue every
FLUSH_S and:
- folds the calls into this process's rows of their clock hour and writes each changed hour
  document whole (one put per hour touched per batch: only this process writes it);
- adds the batch's tokens or cost to every budget that covers its calls (one compare-and-swap
  per budget per batch) and raises the notification of each threshold the batch crossed.

A clean stop (``close``) writes what is queued; SIGKILL loses at most one interval's calls.
``check`` is the refusal at 100%: budgets and their spend are one cached read for every caller
(gateway.refresh_cache), so a call never waits for the store while the cache is fresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from common import budgets, notifications, prices, usage_ledger
from common.errors import LimitExceeded, UnreadableRecord
from common.records import budgets as budget_records
from common.records import notifications as notification_records
from common.records import prices as price_records
from common.records import usage_docs
from common.store.base import Store
from common.usage_ledger import Dims, UsageDoc, UsageRow
from gateway.batch_writer import BatchWriter
from gateway.refresh_cache import RefreshCache

log = logging.getLogger("fabric.gateway.usage")

FLUSH_S = 1.0
MAX_PENDING = 100_000
PRICES_TTL_S = 5.0


class Call(NamedTuple):
    """One call's usage as the gateway saw it (a tuple: cheap to build on the request path)."""
    at: float
    dims: Dims
    input_tokens: int
    output_tokens: int
    cached_tokens: int


def split(tokens: int, input_estimate: int) -> tuple[int, int, int]:
    """(input, output, cached) of a call's token total: the engine's split when it gave one
    (request_body.TokenUsage), else the gateway's prompt estimate (at most the total) as input."""
    if hasattr(tokens, "input"):
        return tokens.input, tokens.output, tokens.cached  # type: ignore[attr-defined]
    entered = min(tokens, max(0, input_estimate))
    return entered, tokens - entered, 0


class UsageLedger:
    def __init__(self, store: Store, source: str, *, clock: Callable[[], float] = time.time,
                 on_drop: Callable[[str, int], None] | None = None, flush_s: float = FLUSH_S,
                 max_pending: int = MAX_PENDING, cache_ttl_s: float = 1.0):
        self._store = store
        self._source = source
        self._clock = clock
        self._on_drop = on_drop
        self._hours: dict[int, dict[Dims, list[int]]] = {}  # hour -> row -> [calls, input, output, cached]
        self._prices: tuple[float, prices.PriceSheet | None] = (float("-inf"), None)
        self._budgets: RefreshCache[tuple[list[budgets.Budget], dict[str, int]]] = RefreshCache(cache_ttl_s, 1)
        self._writer = BatchWriter(self._apply, name="gateway-ledger", interval=flush_s, batch=16384,
                                   max_pending=max_pending, on_drop=on_drop)

    @property
    def dropped(self) -> int:
        return self._writer.dropped

    def record(self, call: Call) -> None:
        self._writer.add(call)

    async def check(self, tenant: str | None, key: str | None) -> None:
        """429 ``budget_exceeded`` naming the budget when a refusing budget covering the call is spent."""
        found, spend = await self._budgets.get("budgets", self._read_budgets)
        if not found:
            return
        hit = budgets.exhausted(found, spend, tenant, key)
        if hit is not None:
            now = self._clock()
            end = budgets.period_bounds(hit.period, now)[1]
            what = f"{hit.limit:g} {'tokens' if hit.metric == 'tokens' else 'in cost'}"
            raise LimitExceeded(f"budget {hit.name!r} is spent: {what} per {hit.period} "
                                f"({'key ' + hit.key if hit.key else 'tenant ' + str(hit.tenant)}); "
                                "calls resume when the period ends or an admin raises the limit",
                                retry_after=max(1.0, end - now), code="budget_exceeded")

    def _read_budgets(self) -> tuple[list[budgets.Budget], dict[str, int]]:
        found = budget_records.list(self._store)
        return found, (budget_records.spends(self._store, self._clock()) if found else {})

    def _sheet(self, now: float) -> prices.PriceSheet | None:
        read_at, sheet = self._prices
        if now - read_at >= PRICES_TTL_S:
            try:
                sheet = price_records.read(self._store)
            except UnreadableRecord:  # an operator's sheet that does not parse: nothing is priced
                sheet = None
            self._prices = (now, sheet)
        return sheet

    def _apply(self, calls: list[Call]) -> None:
        now = self._clock()
        dirty: set[int] = set()
        for c in calls:
            hour = usage_ledger.hour_of(c.at)
            rows = self._hours.get(hour)
            if rows is None:
                rows = self._hours[hour] = {}
            sums = rows.get(c.dims)
            if sums is None:
                if len(rows) >= usage_ledger.MAX_ROWS_PER_DOC:
                    if self._on_drop is not None:
                        self._on_drop("row_cap", 1)
                    continue
                sums = rows[c.dims] = [0, 0, 0, 0]
            # plain lists while folding: a pydantic row's attribute writes cost a microsecond each
            sums[0] += 1
            sums[1] += c.input_tokens
            sums[2] += c.output_tokens
            sums[3] += c.cached_tokens
            dirty.add(hour)
        for hour in sorted(dirty):
            usage_docs.put(self._store, UsageDoc(span="hour", start=hour, source=self._source, updated_at=now, rows=[
                UsageRow(tenant=d.tenant, key=d.key, endpoint=d.endpoint, model=d.model, adapter=d.adapter,
                         status=d.status, calls=n[0], input_tokens=n[1], output_tokens=n[2], cached_tokens=n[3])
                for d, n in self._hours[hour].items()]))
        for hour in [h for h in self._hours if h < usage_ledger.hour_of(now) - usage_ledger.HOUR]:
            del self._hours[hour]  # written; no call of that hour can still arrive
        self._charge(calls, now)

    def _charge(self, calls: list[Call], now: float) -> None:
        found = budget_records.list(self._store)
        if not found:
            return
        sheet = self._sheet(now) if any(b.metric == "cost" for b in found) else None
        for b in found:
            units = 0
            for c in calls:
                if b.covers(c.dims.tenant, c.dims.key):
                    cost = prices.cost(sheet, c.dims.model, c.input_tokens, c.output_tokens, c.cached_tokens)
                    units += budgets.amount(b, c.input_tokens + c.output_tokens, cost)
            if units <= 0:
                continue
            before, after = budget_records.add(self._store, b, units, now)
            start = budgets.period_bounds(b.period, now)[0]
            for pct in budgets.crossed(before, after, b):
                refused = pct >= 100 and b.action == "refuse"
                notification_records.raise_once(self._store, notifications.Notification(
                    id=budgets.event_id(b, start, pct), kind="budget", severity="page" if pct >= 100 else "warning",
                    title=f"budget {b.name} at {pct}%",
                    message=(f"{b.name} ({'key ' + b.key if b.key else 'tenant ' + str(b.tenant)}) used {pct}% "
                             f"of {b.limit:g} {b.metric} this {b.period}"
                             + ("; new calls are refused until the period ends" if refused else "")),
                    tenant=b.tenant, created_at=now,
                    data={"budget": b.name, "threshold": pct, "period": b.period, "period_start": start,
                          "metric": b.metric, "limit": b.limit, "action": b.action,
                          "spent": after / budgets.MICRO if b.metric == "cost" else after}))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
