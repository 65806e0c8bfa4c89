"""A rollout's say in an endpoint's routing plan (pure): which replicas get Maglev weight, how much.

  rolling          a new-revision replica gets weight only once it has been Ready for
                   min_healthy_secs (until then it is excluded, with that reason);
  canary, blue/green (and any rollback)  the record's share splits the weights between the new
                   set and the rest (split.split): the strategy's weights inside each set, the
                   sets' table shares at share : 100 - share.
Weight 0 keeps a replica in the Maglev service (its established flows stay) but gives it no
slots, so a switch moves new connections only. When one set has no routable replica the other
keeps the strategy's weights (a table is never all zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from common.rollouts import Rollout
from common.schemas import Replica
from controlplane.rollouts.plan import healthy
from controlplane.routing.split import Split, split
from controlplane.routing.strategies import RoutingEntry, RoutingPlan


def backend_key(e: RoutingEntry) -> str:
    """The key the agent's table uses for a Maglev backend (ties in slot rounding go by it)."""
    return f"{e.host}:{e.port}" if e.in_maglev else e.replica_id


def apply_rollout(plan: RoutingPlan, replicas: Sequence[Replica], record: Rollout | None,
                  now: float) -> tuple[RoutingPlan, Split | None]:
    if record is None or not record.active:
        return plan, None
    revision = {r.replica_id: r for r in replicas}
    entries = list(plan.entries)
    if record.strategy == "rolling" and record.phase != "RollingBack":
        min_h = 0.0 if record.promote else record.min_healthy_secs
        for i, e in enumerate(entries):
            r = revision.get(e.replica_id)
            if e.included and r is not None and r.revision == record.to_revision and not healthy(r, now, min_h):
                entries[i] = replace(e, included=False, weight=0,
                                     reason=f"rollout {record.id}: weight after {min_h:g}s Ready")
        return replace(plan, entries=tuple(entries)), None
    if record.share is None:
        return plan, None
    new = {i: e for i, e in enumerate(entries) if e.included
           and revision.get(e.replica_id) is not None and revision[e.replica_id].revision == record.to_revision}
    old = {i: e for i, e in enumerate(entries) if e.included and i not in new}
    if not new and not old:
        return plan, None
    # Maglev backends and gateway-only replicas are split separately: each table is its own.
    result: Split | None = None
    for maglev in (True, False):
        n = {backend_key(e): e.weight for e in new.values() if e.in_maglev == maglev}
        o = {backend_key(e): e.weight for e in old.values() if e.in_maglev == maglev}
        if not n or not o:  # one set alone keeps the strategy's weights (never an all-zero table)
            continue
        got = split(n, o, record.share)
        if maglev or result is None:
            result = got
        for i, e in {**new, **old}.items():
            if e.in_maglev == maglev:
                side = "new" if i in new else "old"
                entries[i] = replace(e, weight=got.weights[backend_key(e)],
                                     reason=f"{e.reason}; rollout {record.id}: {side} set, new share "
                                            f"{record.share}%")
    return replace(plan, entries=tuple(entries)), result
