"""Budget records (/fabric/budgets/<name>, common.budgets): typed reads and validated writes
(records.resource), and each budget's spend counter (/fabric/counters/budget/<name>: a period
counter of common.records.counters, in the budget's own period). fabricd and the gateway both
read them here."""

from __future__ import annotations

from common import keyspace
from common.budgets import Budget, period_bounds
from common.records import counters
from common.records.resource import Records
from common.store.base import Store

KIND = "budget"
RECORDS = Records(Budget, keyspace.budgets, KIND)
(get, require, exists, stored, stored_items, list, create, put, update,  # noqa: A001 - the module's verbs
 upsert, update_at, update_status, delete, discard, versioned, count) = RECORDS.verbs()


def counter_key(name: str) -> str:
    return keyspace.counters(f"budget/{name}")


def forget(store: Store, name: str) -> None:
    """Drop a budget's spend counter (the budget was deleted)."""
    store.delete(counter_key(name))


def spent(store: Store, budget: Budget, now: float) -> int:
    """The budget's counter for the period containing ``now`` (counter units)."""
    kv = store.get(counter_key(budget.name))
    return 0 if kv is None else counters.period_value(kv.value, period_bounds(budget.period, now)[0])


def add(store: Store, budget: Budget, units: int, now: float) -> tuple[int, int]:
    """Add ``units`` to the budget's current period; (before, after)."""
    start, end = period_bounds(budget.period, now)
    after = counters.period_reserve(store, counter_key(budget.name), units, None, start, end, now).value
    return after - units, after


def spends(store: Store, now: float) -> dict[str, int]:
    """budget name -> its counter in the current period of its own (one store list for all)."""
    by_name = {b.name: b for b in list(store)}
    prefix = keyspace.counters("budget/")
    out = {}
    for kv in store.list(prefix):
        b = by_name.get(kv.key[len(prefix):])
        if b is not None:
            out[b.name] = counters.period_value(kv.value, period_bounds(b.period, now)[0])
    return out
