"""The model job loop (leader-only, under the orchestration lease like the other loops).

Each pass, for every job record that is not Ready or Failed: send the agent of its node the
job (idempotent by id and attempt, so a restarted fabricd or agent simply continues), merge the
agent's answer into the record (controlplane.models.plan.merge: each state the agent passed is
a store write in ``history``) and refresh the model's status (phase, digest, resolved commit).
An unreachable agent leaves the job as it is with a message saying so; an agent that refuses
the job (4xx) fails it with the agent's message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from common.errors import FabricError, TransientError
from common.model_api import ModelJob
from common.records import models, nodes
from common.records.model_jobs import list_jobs, update_job, update_model_status
from common.schemas import ModelArtifact, Node
from common.store.base import Store
from controlplane.models import plan

log = logging.getLogger("fabricd.models")


class ModelWorker:
    def __init__(self, store: Store, agents, *, clock: Callable[[], float] = time.time, jobs_gauge=None):
        self.store = store
        self.agents = agents
        self.clock = clock
        self.jobs_gauge = jobs_gauge  # fabric_model_jobs{state}, set each pass
        self.became_ready = False  # set by tick(): some job turned Ready in that pass

    def _models(self) -> dict[str, ModelArtifact]:
        return {m.name: m for m in models.list(self.store)}

    def _nodes(self) -> dict[str, Node]:
        return {n.id: n for n in nodes.list(self.store)}

    async def tick(self) -> None:
        self.became_ready = False
        jobs = list_jobs(self.store)
        if self.jobs_gauge is not None:
            self.jobs_gauge.clear()
            for state in {j.state for j in jobs}:
                self.jobs_gauge.labels(state).set(sum(1 for j in jobs if j.state == state))
        if not any(not j.terminal for j in jobs):
            return
        models, nodes = self._models(), self._nodes()
        touched: set[str] = set()
        for job in jobs:
            if job.terminal or job.model not in models:
                continue
            await self.advance(models[job.model], job, nodes.get(job.node))
            touched.add(job.model)
        for name in sorted(touched):
            self.refresh_model(models[name])

    async def advance(self, model: ModelArtifact, job: ModelJob, node: Node | None) -> None:
        if node is None:
            return self._note(job, f"node {job.node} is not registered")
        try:
            view = await self.agents.for_node(node).submit_model_job(plan.request_for(model, job))
        except TransientError as exc:
            return self._note(job, f"waiting for the agent on {node.id}: {exc.message}")
        except FabricError as exc:
            message = f"agent on {node.id} refused the job: {exc.message}"
            return self._write(job, lambda j: plan.failed(j, message, self.clock()))
        self._write(job, lambda j: plan.merge(j, view, self.clock()))

    def _note(self, job: ModelJob, message: str) -> None:
        self._write(job, lambda j: None if j.message == message else j.model_copy(
            update={"message": message, "updated_at": self.clock()}))

    def _write(self, job: ModelJob, change) -> None:
        moved = update_job(self.store, job.model, job.node, change)
        if moved is None:
            return  # deleted meanwhile (model deleted or evicted), or it kept changing
        current, updated = moved
        if updated is not None and updated.state == "Ready" != current.state:
            self.became_ready = True
        if updated is not None and updated.state != current.state:
            log.info("model job %s: %s -> %s %s", updated.id, current.state, updated.state, updated.message)

    def refresh_model(self, model: ModelArtifact) -> None:
        refresh_model_status(self.store, model)


def refresh_model_status(store: Store, model: ModelArtifact) -> None:
    jobs = list_jobs(store, model.name)
    phase, message = plan.model_phase(jobs)
    fields: dict = {"phase": phase, "message": message}
    ready = [j for j in jobs if j.state == "Ready" and j.digest]
    if ready:
        fields["digest"] = ready[0].digest
    resolved = next((j.revision for j in jobs if j.revision), None)
    if resolved and not model.status.revision:
        fields["revision"] = resolved  # later nodes fetch this commit, not whatever main is then
    sources = {a.name: a.source for a in model.adapters}
    pinned = dict(model.status.adapter_revisions)
    for j in jobs:  # the same for each adapter: the first commit a node resolved it to
        for name, a in j.adapters.items():
            if a.revision and sources.get(name) == a.source and name not in pinned:
                pinned[name] = a.revision
    pinned = {n: r for n, r in pinned.items() if n in sources}
    if pinned != model.status.adapter_revisions:
        fields["adapter_revisions"] = pinned
    update_model_status(store, model.name, **fields)
