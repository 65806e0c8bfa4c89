"""Pure decisions of the model supply chain: what to ask an agent, what its answer changes in
the store, whether a replica may start, what eviction deletes, and a model's overall status.

  request_for   the agent request for a job: the model's source, the commit another node
                already resolved (so every node fetches the same bytes), checksum, signature
  merge         a job record updated from the agent's view: every state the agent passed
                through is appended to ``history`` (so each transition is in the store even
                when one poll saw several), progress, digest, path, revision; None if unchanged
  gate          a replica's VM may be created on a node only when the model's job there is
                Ready and fetched the model's current adapters (a job whose adapters differ
                is started again); otherwise the replica waits with the job's progress as
                its message. A Ready gate names the adapters' digests for the VM create
  plan_eviction per node, least recently used first, the digests no deployment's model names,
                until the node's cache fits the budget; local sources are never deleted
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common.model_api import (
    AdapterSource,
    AgentJobRequest,
    AgentJobView,
    CacheEntry,
    ModelJob,
    job_id,
    progress_text,
)
from common.schemas import ModelArtifact, Node

STATE_ORDER = {s: i for i, s in enumerate(("Failed", "Registered", "Resolving", "Downloading", "Verifying",
                                           "Scanning", "Ready"))}


def request_for(model: ModelArtifact, job: ModelJob) -> AgentJobRequest:
    """The model and its LoRA adapters, each at the commit a node already resolved (the job's
    own, else the model's status), so every node fetches the same bytes."""
    pinned = model.status.adapter_revisions
    adapters = [AdapterSource(name=a.name, source=a.source, expected_digest=a.digest,
                              revision=(job.adapters[a.name].revision if a.name in job.adapters
                                        and job.adapters[a.name].source == a.source else None)
                              or pinned.get(a.name))
                for a in model.adapters]
    return AgentJobRequest(job_id=job_id(model.name, job.node), attempt=job.attempt, model=model.name,
                           source=model.source, revision=job.revision or model.status.revision,
                           expected_digest=model.digest, require_checksum=bool(model.require_checksum),
                           signature=model.signature, size_bytes=model.size_bytes, adapters=adapters,
                           tenant=model.tenant)


def adapters_current(model: ModelArtifact, job: ModelJob) -> bool:
    """The job fetched exactly the model's adapters (by name and source)."""
    return ({a.name: a.source for a in model.adapters}
            == {name: a.source for name, a in job.adapters.items()})


def merge(job: ModelJob, view: AgentJobView, now: float) -> ModelJob | None:
    if view.attempt != job.attempt:
        return None  # an answer about an older attempt
    seen = {(t.state, round(t.at, 6)) for t in job.history}
    new = [t for t in view.history if (t.state, round(t.at, 6)) not in seen and t.state != "Registered"]
    fields = {"state": view.state, "message": view.message, "revision": view.revision or job.revision,
              "digest": view.digest, "path": view.path, "bytes_done": view.bytes_done,
              "bytes_total": view.bytes_total, "files": view.files, "joined": view.joined,
              "adapters": view.adapters,
              "retries": job.attempt + view.retries}
    if not new and all(getattr(job, k) == v for k, v in fields.items()):
        return None
    return job.model_copy(update={**fields, "history": [*job.history, *new], "updated_at": now})


def failed(job: ModelJob, message: str, now: float) -> ModelJob:
    """The job Failed with ``message``, the transition appended to its history."""
    return job.model_copy(update={"state": "Failed", "message": message, "updated_at": now,
                                  "history": [*job.history, {"state": "Failed", "at": now, "message": message}]})


# A heartbeat this much newer than a job's Ready that lacks its digest means the node lost the bytes.
HEARTBEAT_MARGIN_S = 2.0


@dataclass(frozen=True)
class Gate:
    ready: bool
    message: str
    digest: str | None = None
    record_job: bool = False  # no job exists yet on that node: record one
    restart_job: bool = False  # the job says Ready but the node no longer holds the digest
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapter name -> its digest on the node
    failed: bool = False  # the job ended Failed: a replica waiting for it fails with its message


def gate(model: ModelArtifact, job: ModelJob | None, node: Node | None = None) -> Gate:
    if job is None:
        return Gate(False, f"model {model.name}: Registered (recording a job on this node)", record_job=True)
    if job.state == "Ready" and job.digest:
        if (node is not None and job.digest not in node.cached_models
                and node.last_heartbeat > job.updated_at + HEARTBEAT_MARGIN_S):
            return Gate(False, f"model {model.name}: node {node.id} no longer holds digest {job.digest[:12]}; "
                               "materializing it again", restart_job=True)
        if not adapters_current(model, job):
            return Gate(False, f"model {model.name}: its adapters changed since the job was Ready; "
                               "fetching them", restart_job=True)
        return Gate(True, f"model {model.name}: Ready", job.digest,
                    adapters={name: a.digest for name, a in sorted(job.adapters.items())})
    return Gate(False, progress_text(model.name, job.state, job.bytes_done, job.bytes_total, job.message),
                failed=job.state == "Failed")


@dataclass(frozen=True)
class Eviction:
    node: str
    digest: str
    size_bytes: int
    reason: str


@dataclass(frozen=True)
class EvictionPlan:
    evict: tuple[Eviction, ...]
    kept: tuple[Eviction, ...]  # entries left, with why
    over_budget: dict[str, int]  # node -> bytes still above the budget after the plan


def plan_eviction(entries: Mapping[str, Sequence[CacheEntry]], referenced: Mapping[str, Iterable[str]],
                  budget_bytes: int) -> EvictionPlan:
    """``entries``: node -> its cache; ``referenced``: digest -> names of models a deployment uses."""
    evict: list[Eviction] = []
    kept: list[Eviction] = []
    over: dict[str, int] = {}
    refs = {d: sorted(set(names)) for d, names in referenced.items()}
    for node in sorted(entries):
        cache = sorted(entries[node], key=lambda e: (e.last_used, e.digest))
        total = sum(e.size_bytes for e in cache if not e.local)
        for e in cache:
            if e.local:
                kept.append(Eviction(node, e.digest, e.size_bytes, "local source under FABRIC_MODEL_DIR"))
            elif refs.get(e.digest):
                kept.append(Eviction(node, e.digest, e.size_bytes,
                                     f"model {', '.join(refs[e.digest])} is named by a deployment"))
            elif total > budget_bytes:
                evict.append(Eviction(node, e.digest, e.size_bytes,
                                      f"least recently used; cache {total} bytes > budget {budget_bytes}"))
                total -= e.size_bytes
            else:
                kept.append(Eviction(node, e.digest, e.size_bytes, "within the budget"))
        if total > budget_bytes:
            over[node] = total - budget_bytes
    return EvictionPlan(tuple(evict), tuple(kept), over)


def model_phase(jobs: Sequence[ModelJob]) -> tuple[str, str]:
    """The model's phase from its jobs: the furthest job's state (Ready wins), with its message."""
    if not jobs:
        return "Registered", "model registered; no node has materialized it"
    best = max(jobs, key=lambda j: (STATE_ORDER.get(j.state, 0), j.node))
    ready = [j.node for j in jobs if j.state == "Ready"]
    if ready:
        return "Ready", f"ready on {', '.join(sorted(ready))}"
    return best.state, f"{best.node}: {best.message}"
