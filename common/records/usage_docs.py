"""Usage ledger documents (/fabric/usage/{hour|day}/{start}/{source}, common.usage_ledger.UsageDoc):
each written whole by its only writer (a gateway process for its hour, fabricd's compaction for a
day); compaction writes a day before it deletes the hours it holds."""

from __future__ import annotations

import builtins
import time

from common import keyspace
from common.records import reading
from common.store.base import Store
from common.usage_ledger import DAY, HOUR, SPANS, Compaction, UsageDoc, plan_compaction

KIND = "usage document"


def put(store: Store, doc: UsageDoc) -> None:
    """Write a document whole (its writer is its only writer)."""
    store.put(keyspace.usage(doc.span, doc.start, doc.source), doc.model_dump_json())


def docs(store: Store, since: float = 0.0, until: float = float("inf")) -> builtins.list[UsageDoc]:
    """Every readable document whose span overlaps [since, until); unreadable ones are skipped and
    counted, and so is an hour a day document already holds (compaction deletes it after the day)."""
    found = [(kv.key, doc) for kv, doc in reading.pairs(UsageDoc, store.list(keyspace.usage()), KIND)]
    folded = {k for _, doc in found if doc.span == "day" for k in doc.folded}
    return [doc for key, doc in found
            if key not in folded and doc.start < until and doc.start + SPANS.get(doc.span, HOUR) > since]


def stored_keys(store: Store) -> builtins.list[str]:
    return [kv.key for kv in store.list(keyspace.usage())]


def compact(store: Store, now: float | None = None, retention_s: float = 90 * DAY) -> Compaction:
    """Apply ``plan_compaction``: a day is written (naming the hours it holds, which readers then
    skip) before those hours are deleted, so a crash in between neither loses nor doubles a row."""
    plan = plan_compaction(docs(store), stored_keys(store), time.time() if now is None else now, retention_s)
    for doc in plan.days:
        put(store, doc)
    for key in plan.delete:
        store.delete(key)
    return plan
