"""The usage ledger's compaction (common.usage_ledger): hours older than two days fold into their
day, nothing is lost or counted twice when a pass stops between writing a day and deleting its
hours, and documents past the retention go."""

from __future__ import annotations

from common import keyspace, usage_ledger
from common.records import usage_docs
from common.store import open_store
from common.usage_ledger import DAY, HOUR, UsageDoc, UsageRow

NOW = 100 * DAY + 5 * HOUR


def row(calls: int, tenant: str = "acme") -> UsageRow:
    return UsageRow(tenant=tenant, endpoint="chat", model="m", calls=calls, input_tokens=10 * calls)


def calls(store, tenant: str = "acme") -> int:
    return sum(r.calls for d in usage_docs.docs(store) for r in d.rows if r.tenant == tenant)


def test_old_hours_fold_into_their_day_and_expired_documents_go(tmp_path):
    store = open_store(f"sqlite://{tmp_path}/f.db")
    old_day = 95 * DAY
    for h, source, n in ((old_day + HOUR, "gw-a", 2), (old_day + 2 * HOUR, "gw-b", 3), (NOW - HOUR, "gw-a", 7),
                         (10 * DAY, "gw-a", 100)):
        usage_docs.put(store, UsageDoc(span="hour", start=h, source=source, rows=[row(n)]))
    assert calls(store) == 112
    plan = usage_docs.compact(store, NOW, retention_s=30 * DAY)
    assert [(d.start, [r.calls for r in d.rows]) for d in plan.days] == [(old_day, [5])]
    keys = usage_docs.stored_keys(store)
    assert keys == [keyspace.usage("day", old_day, "all"), keyspace.usage("hour", NOW - HOUR, "gw-a")]
    assert calls(store) == 12  # 100 calls were older than the retention
    # A later hour of the same day folds into the day already written, keeping its rows.
    usage_docs.put(store, UsageDoc(span="hour", start=old_day + 3 * HOUR, source="gw-c", rows=[row(4)]))
    usage_docs.compact(store, NOW, retention_s=30 * DAY)
    [day] = [d for d in usage_docs.docs(store) if d.span == "day"]
    assert [r.calls for r in day.rows] == [9] and calls(store) == 16
    store.close()


def test_a_pass_stopped_between_the_day_and_the_deletes_counts_each_row_once(tmp_path):
    store = open_store(f"sqlite://{tmp_path}/f.db")
    old_day = 95 * DAY
    usage_docs.put(store, UsageDoc(span="hour", start=old_day, source="gw-a", rows=[row(2)]))
    plan = usage_ledger.plan_compaction(usage_docs.docs(store), usage_docs.stored_keys(store), NOW, 30 * DAY)
    for doc in plan.days:  # the day is written; the pass dies before deleting the hour
        usage_docs.put(store, doc)
    assert calls(store) == 2  # the hour is named in the day's folded list: skipped by readers
    usage_docs.put(store, UsageDoc(span="hour", start=old_day + HOUR, source="gw-a", rows=[row(1)]))
    usage_docs.compact(store, NOW, retention_s=30 * DAY)  # the next pass finishes the job
    assert calls(store) == 3 and len(usage_docs.stored_keys(store)) == 1
    store.close()


def test_merge_sums_equal_dimensions():
    merged = usage_ledger.merge([row(1), row(2), row(4, tenant="beta")])
    assert [(r.tenant, r.calls, r.input_tokens) for r in merged] == [("acme", 3, 30), ("beta", 4, 40)]
