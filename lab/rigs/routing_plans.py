"""Publish routing plans the way the routing controller's tick does (its real planner and record),
for tests and benchmarks that run the gateway or explain without a routing loop: no scrape, no
VIP, no push."""

from __future__ import annotations

import time

from common import keyspace
from common.records import plans
from common.records.plans import PublishedPlan, next_generation
from common.schemas import Replica, ReplicaObservation
from common.store.base import Store
from controlplane.orchestration_state import load_snapshot
from controlplane.routing.publish import live_plan


def publish_plans(store: Store, now: float | None = None, *, scraped: bool = True) -> dict[str, PublishedPlan]:
    """Every endpoint's plan on the store's current replicas and observations, published.
    ``scraped``: a Ready replica with no observation gets an ok one first, as the routing tick's
    scrape of a live engine would write (the planner routes only scraped replicas)."""
    now = time.time() if now is None else now
    if scraped:
        for kv in store.list(keyspace.replicas()):
            r = Replica.model_validate_json(kv.value)
            if r.ready and store.get(keyspace.observations(r.replica_id)) is None:
                store.put(keyspace.observations(r.replica_id),
                          ReplicaObservation(replica_id=r.replica_id, scraped_at=now, ok=True).model_dump_json())
    snap = load_snapshot(store)
    return {name: plans.publish(store, live_plan(ep, snap, now, next_generation(store, plans.get(store, name))))
            for name, ep in snap.endpoints.items()}
