"""The usage ledger: what every gateway call used, rolled up per clock hour (and, once compacted,
per UTC day) per tenant, key, endpoint, model, adapter and outcome.

Store layout (common.keyspace.usage): ``/fabric/usage/hour/{start}/{gateway}`` is one document per
gateway process and clock hour, holding that process's rows for the hour; only that process writes
it (a plain put of its in-memory rollup, so several gateways never contend and a batch of calls is
one write, not one per call). fabricd compacts hour documents older than COMPACT_AFTER_S into one
``/fabric/usage/day/{start}/all`` per UTC day, and deletes documents older than the retention
(FABRIC_USAGE_RETENTION_DAYS). Store cost: at most one put per gateway process per flush interval
while calls arrive, whatever the call rate.

A row's figures are exact sums: calls, input/output/cached tokens as the engine reported them
(or the gateway's count when the answer had none), and GPU-seconds attributed by fabricd when it
reads (controlplane.tenancy.usage: the deployment's ready GPU-seconds split by token share).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from pydantic import BaseModel

from common import keyspace

HOUR = 3600
DAY = 86400
COMPACT_AFTER_S = 2 * DAY  # hour documents older than this are folded into their day
SPANS = {"hour": HOUR, "day": DAY}
MAX_ROWS_PER_DOC = 20_000  # a gateway's distinct rows in one hour; past it a call's row is dropped and counted


class Dims(NamedTuple):
    """What one row is about. Every field is bounded by records (keys, endpoints, models) or by
    the gateway's own vocabulary (status: the call's outcome). A tuple: built on every call, and a
    frozen dataclass cost several times as much to build (measured: 2 us for it and the Call)."""
    tenant: str | None
    key: str | None
    endpoint: str
    model: str
    adapter: str | None
    status: str


class UsageRow(BaseModel):
    tenant: str | None = None
    key: str | None = None
    endpoint: str = ""
    model: str = ""
    adapter: str | None = None
    status: str = "success"
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    gpu_seconds: float = 0.0

    @property
    def dims(self) -> Dims:
        return Dims(self.tenant, self.key, self.endpoint, self.model, self.adapter, self.status)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class UsageDoc(BaseModel):
    span: str  # "hour" or "day"
    start: int  # the span's first second (UTC)
    source: str  # the gateway process that wrote it, or "all" for a compacted day
    rows: list[UsageRow]
    updated_at: float = 0.0
    folded: list[str] = []  # a day: the hour documents already summed into it (readers skip them)


def hour_of(t: float) -> int:
    return int(t // HOUR) * HOUR


def day_of(t: float) -> int:
    return int(t // DAY) * DAY


def merge(rows: Iterable[UsageRow]) -> list[UsageRow]:
    """Rows with equal dims summed into one (order: first seen)."""
    out: dict[Dims, UsageRow] = {}
    for r in rows:
        have = out.get(r.dims)
        if have is None:
            out[r.dims] = r.model_copy()
        else:
            have.calls += r.calls
            have.input_tokens += r.input_tokens
            have.output_tokens += r.output_tokens
            have.cached_tokens += r.cached_tokens
            have.gpu_seconds += r.gpu_seconds
    return list(out.values())


@dataclass(frozen=True)
class Compaction:
    """What fabricd's pass writes and deletes (pure: ``plan_compaction``)."""
    days: list[UsageDoc]  # day documents to write (each replaces the one stored)
    delete: list[str]  # keys to delete (folded hours, expired documents)


def plan_compaction(stored: list[UsageDoc], keys: list[str], now: float, retention_s: float) -> Compaction:
    """``stored``: the readable documents (common.records.usage_docs.docs); ``keys``: every key under the ledger. Hour
    documents older than COMPACT_AFTER_S fold into their day's document (merged with the day
    already stored, which then names them in ``folded``); any document whose span ended before
    now - retention goes; a folded hour still stored is deleted."""
    oldest = now - retention_s
    delete: list[str] = []
    days: dict[int, list[UsageRow]] = {}
    folded: dict[int, list[str]] = {}
    for doc in stored:
        key = keyspace.usage(doc.span, doc.start, doc.source)
        if doc.start + SPANS.get(doc.span, HOUR) <= oldest:
            delete.append(key)
        elif doc.span == "hour" and doc.start + HOUR <= now - COMPACT_AFTER_S:
            days.setdefault(day_of(doc.start), []).extend(doc.rows)
            folded.setdefault(day_of(doc.start), []).append(key)
            delete.append(key)
    present = set(keys)
    for doc in stored:
        if doc.span == "day" and doc.start + DAY > oldest:
            left = [k for k in doc.folded if k in present]  # written, not yet deleted
            delete.extend(left)
            if doc.start in days:  # a day already compacted keeps its rows (and what it still hides)
                days[doc.start].extend(doc.rows)
                folded[doc.start].extend(left)
    written = [UsageDoc(span="day", start=d, source="all", rows=merge(rows), updated_at=now, folded=folded[d])
               for d, rows in sorted(days.items())]
    return Compaction(written, delete)
