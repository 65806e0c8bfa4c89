"""Usage and cost over time (GET /api/ai/usage, `fabricctl ai usage`, the console's tenant usage
page): ``report(store, query, now)`` is the one call every view makes, so they cannot disagree.

It reads the usage ledger (common.usage_ledger), sums the rows that pass the query's filters per
time bucket (hour or day) and per the dimensions asked for, attributes GPU-seconds and prices the
result (common.prices.cost). ``rollup`` is the pure part.

GPU-seconds attributed: each deployment's ready GPU-seconds in a ledger span (integrated exactly
from the replica lifetime ledger, controlplane.tenancy.finops.integrate) are split over the rows
of that span whose endpoint serves the deployment, in proportion to their tokens; a deployment
that served no tokens in a span attributes nothing (its GPU-seconds still show in GET
/api/ai/finops). So a tenant's GPU cost is its share of what its traffic kept busy.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from common import prices, usage_ledger
from common.errors import InvalidInput
from common.records import endpoints, lifetimes, usage_docs
from common.records import prices as price_records
from common.records.lifetimes import Lifetime
from common.store.base import Store
from common.usage_ledger import UsageDoc
from controlplane.tenancy import finops

DIMENSIONS = ("tenant", "key", "endpoint", "model", "adapter", "status")
FIGURES = ("calls", "input_tokens", "output_tokens", "cached_tokens", "tokens", "gpu_seconds", "cost")
MAX_ROWS = 10_000
MAX_RANGE_S = 400 * 86400


@dataclass(frozen=True)
class UsageQuery:
    since: float
    until: float
    granularity: str = "hour"  # "hour" or "day" ("total": one bucket for the whole range)
    group_by: tuple[str, ...] = ("tenant",)
    filters: Mapping[str, str] = field(default_factory=dict)  # dimension -> the only value kept

    def __post_init__(self) -> None:
        if self.granularity not in ("hour", "day", "total"):
            raise InvalidInput("granularity is hour, day or total")
        bad = [d for d in (*self.group_by, *self.filters) if d not in DIMENSIONS]
        if bad:
            raise InvalidInput(f"unknown dimension {', '.join(bad)}; known: {', '.join(DIMENSIONS)}")
        if not self.until > self.since or self.until - self.since > MAX_RANGE_S:
            raise InvalidInput(f"until must be after since, at most {MAX_RANGE_S // 86400} days later")


def bucket(start: int, query: UsageQuery) -> int:
    if query.granularity == "total":
        return int(query.since)
    if query.granularity == "day":
        return usage_ledger.day_of(start)
    return start  # an hour document's hour, or a compacted day's first second


def attribute(docs: list[UsageDoc], lives: Iterable[Lifetime], deployment_of: Mapping[str, str]) -> dict[int, float]:
    """id(row) -> GPU-seconds attributed (see the module docstring)."""
    per_dep: dict[str, list[Lifetime]] = {}
    for life in lives:
        per_dep.setdefault(life.deployment, []).append(life)
    out: dict[int, float] = {}
    spans: dict[tuple[int, int, str], list] = {}
    for doc in docs:
        span = usage_ledger.SPANS.get(doc.span, usage_ledger.HOUR)
        for row in doc.rows:
            dep = deployment_of.get(row.endpoint)
            if dep is not None and row.tokens > 0:
                spans.setdefault((doc.start, span, dep), []).append(row)
    for (start, span, dep), rows in spans.items():
        ready = sum(finops.integrate(life, start, start + span).ready for life in per_dep.get(dep, ()))
        total = sum(r.tokens for r in rows)
        for r in rows:
            out[id(r)] = ready * r.tokens / total
    return out


def rollup(docs: list[UsageDoc], query: UsageQuery, sheet: prices.PriceSheet | None,
           gpu: Mapping[int, float] | None = None) -> dict:
    """Pure: the report of ``docs`` for ``query`` (``gpu``: attribute's answer)."""
    gpu = gpu or {}
    sums: dict[tuple, dict] = {}
    for doc in docs:
        if not (doc.start < query.until and doc.start + usage_ledger.SPANS.get(doc.span, 3600) > query.since):
            continue
        for row in doc.rows:
            if any(str(getattr(row, d)) != v for d, v in query.filters.items()):
                continue
            at = bucket(doc.start, query)
            dims = tuple(getattr(row, d) for d in query.group_by)
            s = sums.get((at, dims))
            if s is None:
                s = sums[(at, dims)] = {"start": at, **dict(zip(query.group_by, dims)),
                                        **{f: 0 for f in FIGURES}}
            g = gpu.get(id(row), 0.0)
            s["calls"] += row.calls
            s["input_tokens"] += row.input_tokens
            s["output_tokens"] += row.output_tokens
            s["cached_tokens"] += row.cached_tokens
            s["tokens"] += row.tokens
            s["gpu_seconds"] += g
            s["cost"] += prices.cost(sheet, row.model, row.input_tokens, row.output_tokens, row.cached_tokens, g)
    rows = sorted(sums.values(), key=lambda r: (r["start"], *(str(r[d]) for d in query.group_by)))
    totals = {f: sum(r[f] for r in rows) for f in FIGURES}
    for r in [*rows, totals]:
        r["gpu_seconds"] = round(r["gpu_seconds"], 3)
        r["cost"] = round(r["cost"], 6)
    return {
        "since": query.since, "until": query.until, "granularity": query.granularity,
        "group_by": list(query.group_by), "filters": dict(query.filters),
        "currency": sheet.currency if sheet is not None else None,
        "truncated": len(rows) > MAX_ROWS, "rows": rows[:MAX_ROWS], "totals": totals,
    }


def deployment_of(store: Store) -> dict[str, str]:
    """endpoint -> the deployment it serves (for the GPU-seconds attribution)."""
    return {e["name"]: e["deployment"] for e in endpoints.RECORDS.readable(store)
            if isinstance(e.get("name"), str) and isinstance(e.get("deployment"), str)}


def report(store: Store, query: UsageQuery, now: float) -> dict:
    """The usage report for ``query`` from the store: the one call behind GET /api/ai/usage,
    `fabricctl ai usage` and the console's tenant usage page (filters={"tenant": ...})."""
    docs = usage_docs.docs(store, query.since, query.until)
    lives = lifetimes.load(store, now)
    return rollup(docs, query, price_records.read(store), attribute(docs, lives, deployment_of(store)))


def to_csv(report_: dict) -> str:
    out = io.StringIO()
    cols = ["start", *report_["group_by"], *FIGURES]
    w = csv.DictWriter(out, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in report_["rows"]:
        w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in cols})
    return out.getvalue()
