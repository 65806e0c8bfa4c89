"""Applies controlplane.dryrun.plan each reconcile tick (the controllers use it in place of the
reconcile worker when FABRIC_DRY_RUN=1). Every write goes through the fenced store it is given."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from common.records import deployments, observations
from common.records import rollouts as rollout_records
from common.store.base import Store
from controlplane.dryrun.plan import plan
from controlplane.orchestration_state import (
    delete_replica,
    load_snapshot,
    put_replica,
    update_deployment_status,
)

log = logging.getLogger("fabricd.dryrun")


class DryRunWorker:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock

    async def tick(self) -> None:
        snap = load_snapshot(self.store)
        now = self.clock()
        for name in sorted(snap.deployments):
            p = plan(snap.deployments[name], snap.replicas.get(name, []), now)
            for rid in p.delete:
                delete_replica(self.store, name, rid)
                observations.discard(self.store, rid)
            if p.delete_deployment:
                deployments.discard(self.store, name)
                rollout_records.forget(self.store, name)
                log.info("deployment %s deleted (dry run)", name)
                continue
            for replica in p.create:
                put_replica(self.store, replica)
            for obs in p.observe:
                observations.put(self.store, obs)
            if p.status is not None:
                update_deployment_status(self.store, name, **p.status)

    def next_retry_at(self) -> float | None:
        return None

    async def aclose(self) -> None:
        return None
