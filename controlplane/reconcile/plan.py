"""The reconcile decision for one deployment: a pure function returning actions with reasons.

Inputs are plain data: the deployment, its profile and model (None when missing), its replica
records, the nodes, this tick's health probe of each replica, the GPU reservations, the CPU and
memory the replicas of every deployment hold per node (``scheduler.committed_resources``) and now.
The controller applies the actions in order and records the status the plan computed.

Rules:
  - a missing model or profile makes the deployment Failed, with the name that is missing;
  - a probe that answers makes a replica Ready and zeroes its failure count; a failed probe
    adds one, and the third consecutive failure replaces the replica: an engine that still
    answers HTTP (an error status) drains first like any removal, one that does not answer is
    deleted at once (nothing can be in flight there); scale-up creates the replacement with the
    first unused ordinal;
  - a replica still inside its start budget (its runtime's, common.runtimes.start_budget, at
    most ``start_timeout_s``, FABRIC_START_TIMEOUT_SECS) is Starting, whatever its probe says;
    past it, it is replaced (a failure): the gateway holds a call at zero replicas as long, so a
    held call never outwaits the replica it waits for;
  - a replica whose VM or engine process ended (``vm_failures``: the engine's own last error
    line, read from its log by the applier) is Failed with that line as its reason and released;
    so is one whose model job failed (``model_failures``: the job's message), and one that never
    got an address within the start budget unless it is waiting for a model job that is still
    running (``model_waits``);
  - failures are counted per deployment across replacements (controlplane.reconcile.crashloop):
    replacements back off exponentially and the deployment parks in CrashLoop after
    ``crashloop.park_after`` failures, creating nothing until restarted;
  - a replica on an offline node is replaced only when another node can take it, so the last
    copy is kept while nothing else can serve; a ready one drains first;
  - replica counts are per revision: ``targets`` ({revision: count}, from a rollout record;
    by default {deployment.revision: deployment.replicas}) and ``templates`` ({revision:
    (profile, model)}) for placing a revision other than the deployment's own; a replica of a
    revision with no target is surplus;
  - scale-down drains first (weight 0, ``draining``) and deletes once the grace has passed;
    replicas that are not Ready go first, then the one with the least work (running + waiting
    requests in its last scrape; unknown counts as most), then the highest ordinal;
  - a drain deadline that has passed deletes the replica, and so does a draining replica whose
    engine reported nothing running or waiting after its weight 0 reached the agents (``drained``,
    computed by the applier from the observations);
  - a deployment being deleted drains the same way (``plan_deletion``);
  - each replica the plan creates is reserved in its placement index (its GPUs, its profile's CPU
    and memory) before the next one is placed; ``placement`` gives the pass's one index, shared by
    every deployment's plan (the applier's per-pass capacity, orchestration_state.Capacity), else
    the plan builds its own from ``reservations`` and ``committed``, which it only reads. A replica the plan deletes still holds
    both until the apply has removed it (its record and reservations go only after the agent
    confirmed), so its replacement is placed against a node that still holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from common.runtimes import start_budget
from common.schemas import (
    InferenceDeployment,
    InferenceProfile,
    ModelArtifact,
    Node,
    Replica,
    ReplicaObservation,
    Site,
)
from controlplane.placement.index import PlacementIndex, place
from controlplane.placement.scheduler import Committed, SchedulerSettings, node_online
from controlplane.reconcile.crashloop import BACKOFF_PHASE, CRASHLOOP_PHASE, CrashLoopSettings, crash_state
from controlplane.routing.strategies import MAX_SCRAPE_AGE_S

FAILURES_TO_REPLACE = 3


@dataclass(frozen=True)
class Probe:
    """This tick's GET /health of one replica (None when it has no address yet)."""

    ok: bool
    message: str = ""
    answered: bool = False  # an HTTP status came back (the engine runs; requests may be in flight)


@dataclass(frozen=True)
class ReconcileSettings:
    drain_grace_s: float = 30.0
    # A draining replica counts as idle only from a scrape this long after the drain started, so
    # the routing job (one period) has pushed its weight 0 and no new request can be in flight.
    drain_settle_s: float = 11.0
    start_timeout_s: float = 900.0  # the most any runtime's start budget may be (FABRIC_START_TIMEOUT_SECS)
    # One health probe's deadline (FABRIC_HEALTH_TIMEOUT_SECS); FAILURES_TO_REPLACE misses in a row
    # replace a Ready replica, so a busy CPU engine in the lab gets longer than a GPU guest's 2 s.
    health_timeout_s: float = 2.0
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    crashloop: CrashLoopSettings = field(default_factory=CrashLoopSettings)
    # FABRIC_DENY_RUNTIMES / FABRIC_ALLOW_RUNTIMES (controlplane.settings): a stored profile whose
    # runtime they refuse starts nothing and its deployments are Failed with the reason
    deny_runtimes: tuple[str, ...] = ()
    allow_runtimes: tuple[str, ...] = ()


@dataclass(frozen=True)
class UpdateHealth:
    replica_id: str
    ready: bool
    health_failures: int
    phase: str
    message: str
    ready_since: float | None = None  # set when the replica turns Ready


@dataclass(frozen=True)
class CreateReplica:
    ordinal: int
    node: str
    gpus: tuple[str, ...]
    reason: str
    revision: int = 1


@dataclass(frozen=True)
class DeleteReplica:
    replica_id: str
    reason: str


@dataclass(frozen=True)
class StartDrain:
    replica_id: str
    deadline: float
    reason: str


@dataclass(frozen=True)
class FailReplica:
    """The replica is broken beyond waiting: phase Failed with ``reason``, then released."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class SetStatus:
    phase: str
    message: str
    ready_replicas: int
    replicas: int
    failures: int = 0
    last_failure: str = ""
    last_failure_at: float | None = None


Action = UpdateHealth | CreateReplica | DeleteReplica | StartDrain | FailReplica | SetStatus


@dataclass
class ReconcilePlan:
    deployment: str
    actions: list[Action] = field(default_factory=list)

    @property
    def status(self) -> SetStatus:
        return next(a for a in self.actions if isinstance(a, SetStatus))


def first_unused_ordinals(used: Collection[int], count: int) -> list[int]:
    out, n = [], 0
    while len(out) < count:
        if n not in used:
            out.append(n)
        n += 1
    return out


def plan(
    deployment: InferenceDeployment,
    profile: InferenceProfile | None,
    model: ModelArtifact | None,
    replicas: Sequence[Replica],
    nodes: Sequence[Node],
    observations: Mapping[str, Probe],
    now: float,
    *,
    reservations: Mapping[str, Collection[str]] | None = None,
    committed: Mapping[str, Committed] | None = None,
    settings: ReconcileSettings = ReconcileSettings(),
    targets: Mapping[int, int] | None = None,
    templates: Mapping[int, tuple[InferenceProfile | None, ModelArtifact | None]] | None = None,
    work: Mapping[str, float] | None = None,
    drained: Collection[str] = (),
    sites: Mapping[str, Site] | None = None,
    vm_failures: Mapping[str, str] | None = None,
    model_failures: Mapping[str, str] | None = None,
    model_waits: Collection[str] = (),
    placement: Callable[[], PlacementIndex] | None = None,
) -> ReconcilePlan:
    out = ReconcilePlan(deployment.name)
    total = len(replicas)
    st = deployment.status
    if model is None or profile is None:
        missing = f"model {deployment.model!r}" if model is None else f"profile {deployment.profile!r}"
        ready = sum(1 for r in replicas if r.ready)
        out.actions.append(SetStatus("Failed", f"{missing} does not exist", ready, total, st.failures,
                                     st.last_failure, st.last_failure_at))
        return out
    vm_failures, model_failures = vm_failures or {}, model_failures or {}
    failed_now: list[str] = []  # this tick's failures, for the crash-loop count
    start_s = min(start_budget(profile.runtime), settings.start_timeout_s)

    targets = dict(targets) if targets is not None else {deployment.revision: deployment.replicas}
    templates = {deployment.revision: (profile, model), **dict(templates or {})}
    reservations = reservations or {}  # read only: what the plan places goes into its placement index
    committed = committed or {}
    by_id = {n.id: n for n in nodes}
    gone: set[str] = set()
    drained_now: set[str] = set()  # drains started by this plan (they leave the live set)
    notes: list[str] = []
    ready_ids: set[str] = set()

    # 1. Health and drain deadlines of the replicas that exist.
    for r in sorted(replicas, key=lambda r: r.ordinal):
        if r.phase == "Deleting":
            gone.add(r.replica_id)  # the loop keeps retrying its deletion
            continue
        if r.draining:
            done = drain_done(r, now, drained)
            if done:
                out.actions.append(DeleteReplica(r.replica_id, done))
                gone.add(r.replica_id)
            continue
        probe = observations.get(r.replica_id)
        broken = vm_failures.get(r.replica_id) if probe is None or not probe.ok else None
        job = model_failures.get(r.replica_id)
        if broken is not None or job is not None:
            why = f"engine exited: {broken}" if broken is not None else f"model job failed: {job}"
            out.actions.append(FailReplica(r.replica_id, why))
            gone.add(r.replica_id)
            failed_now.append(f"{r.replica_id}: {why}")
            continue
        if probe is None:
            if (not r.host and r.replica_id not in model_waits
                    and now - r.created_at > start_s):
                # Never got an address (a VM create that never finished): release its GPUs.
                out.actions.append(FailReplica(r.replica_id, f"no address after the start budget "
                                               f"({start_s:.0f}s)"))
                gone.add(r.replica_id)
            continue
        if probe.ok:
            ready_ids.add(r.replica_id)
            if not r.ready or r.health_failures or r.phase != "Ready":
                since = r.ready_since if r.ready else now
                out.actions.append(UpdateHealth(r.replica_id, True, 0, "Ready", "health answers", since))
            continue
        failures = r.health_failures + 1
        if not r.ready:
            # A booting replica (a VM takes minutes, an engine seconds) is judged by the start
            # timeout, not by failed probes: its health answers only once the engine is up.
            if now - r.created_at > start_s:
                why = f"not ready after {start_s:.0f}s ({probe.message})"
                out.actions.append(DeleteReplica(r.replica_id, why))
                gone.add(r.replica_id)
                failed_now.append(f"{r.replica_id}: {why}")
            else:
                out.actions.append(UpdateHealth(r.replica_id, False, 0, "Starting",
                                                f"waiting for health to answer: {probe.message}"))
            continue
        if failures >= FAILURES_TO_REPLACE:
            why = f"health failed {failures} times in a row: {probe.message}"
            if probe.answered:  # the engine runs: its streams finish first (weight 0, then deleted)
                out.actions.append(StartDrain(r.replica_id, now + settings.drain_grace_s, why))
            else:
                out.actions.append(DeleteReplica(r.replica_id, why))
                gone.add(r.replica_id)
            failed_now.append(f"{r.replica_id}: {why}")
            drained_now.add(r.replica_id)
            notes.append(f"replacing {r.replica_id}: health failed {failures} times")
        else:
            out.actions.append(
                UpdateHealth(r.replica_id, True, failures, "Unhealthy", f"health failed ({failures}): {probe.message}")
            )
            ready_ids.add(r.replica_id)

    live = [r for r in replicas if r.replica_id not in gone and r.replica_id not in drained_now and not r.draining]

    # 2. Replicas on offline nodes: move them only when another node can take them.
    for r in sorted(live, key=lambda r: r.ordinal):
        node = by_id.get(r.node)
        if node is not None and node_online(node, now, settings.scheduler):
            continue
        others = [x for x in live if x.replica_id != r.replica_id and x.replica_id not in gone]
        r_profile, r_model = templates.get(r.revision, (profile, model))
        if r_profile is None or r_model is None:
            continue
        trial = place(deployment, r_profile, r_model, nodes, reservations, now, settings.scheduler,
                      replicas=others, exclude={r.node}, committed=committed, sites=sites)
        if trial.node is None:
            notes.append(f"{r.replica_id} is on offline node {r.node} and kept: no other node can take it")
            continue
        why = f"node {r.node} is offline; {trial.node} can take it"
        if r.replica_id in ready_ids:  # it may still serve: drain it like any removal
            out.actions.append(StartDrain(r.replica_id, now + settings.drain_grace_s, why))
            drained_now.add(r.replica_id)
        else:
            out.actions.append(DeleteReplica(r.replica_id, why))
            gone.add(r.replica_id)
        ready_ids.discard(r.replica_id)

    live = [r for r in replicas if r.replica_id not in gone and r.replica_id not in drained_now and not r.draining]
    desired = sum(targets.values())
    revisions = sorted(set(targets) | {r.revision for r in live})

    # 3. Scale down each revision to its target: drain the surplus (not-ready first, then the one
    #    with the least work, then the highest ordinals).
    load = work or {}
    for rev in revisions:
        mine = [r for r in live if r.revision == rev]
        want = targets.get(rev, 0)
        if len(mine) <= want:
            continue
        why = f"scale down to {want}" if len(targets) == 1 else f"revision {rev} scales down to {want}"
        victims = sorted(mine, key=lambda r: (r.replica_id in ready_ids, load.get(r.replica_id, float("inf")),
                                              -r.ordinal))
        for r in victims[: len(mine) - want]:
            if r.replica_id in ready_ids:
                least = f"; least work ({load[r.replica_id]:g} requests)" if r.replica_id in load else ""
                out.actions.append(StartDrain(r.replica_id, now + settings.drain_grace_s, why + least))
            else:
                out.actions.append(DeleteReplica(r.replica_id, f"{why}; it was not ready"))
                gone.add(r.replica_id)
            ready_ids.discard(r.replica_id)

    # 4. Scale up each revision: first unused ordinals, each placed with the reservations so far;
    #    nothing while the deployment backs off after a failure or is parked (crash loop).
    live = [r for r in replicas if r.replica_id not in gone and r.replica_id not in drained_now and not r.draining]
    crash = crash_state(st, failed_now, live, now, settings.crashloop)
    wanting = sum(targets.values()) > len(live)
    blocked = wanting and (crash.parked or crash.wait_until is not None)
    pending_message = crash.message(deployment.name, now) if blocked else ""
    # A record still being deleted holds its ordinal; one deleted by this plan frees it.
    deleted_now = {a.replica_id for a in out.actions if isinstance(a, DeleteReplica)}
    used = {r.ordinal for r in replicas if r.replica_id not in deleted_now}
    placed = list(live)
    index: PlacementIndex | None = None  # one free-capacity index for every replica placed below
    build = placement or (lambda: PlacementIndex(nodes, reservations, now, settings.scheduler, committed=committed,
                                                 sites=sites))
    for rev in revisions:
        missing = targets.get(rev, 0) - sum(1 for r in live if r.revision == rev)
        if missing <= 0 or pending_message:
            continue
        r_profile, r_model = templates.get(rev, (None, None))
        if r_profile is None or r_model is None:
            pending_message = f"revision {rev}'s model or profile does not exist"
            continue
        for ordinal in first_unused_ordinals(used, missing):
            if index is None:
                index = build()
            trial = index.place(deployment, r_profile, r_model, replicas=placed)
            if trial.node is None:
                pending_message = trial.message
                break
            index.reserve(trial.node, trial.gpus, r_profile)
            used.add(ordinal)
            out.actions.append(CreateReplica(ordinal, trial.node, trial.gpus, trial.message, rev))
            placed.append(Replica(replica_id=f"planned-{ordinal}", deployment=deployment.name,
                                  ordinal=ordinal, revision=rev, node=trial.node))

    ready = len(ready_ids)
    count = len(live) + sum(1 for a in out.actions if isinstance(a, CreateReplica))
    if blocked and crash.parked:
        phase, message = CRASHLOOP_PHASE, f"{ready}/{desired} replicas ready; {pending_message}"
    elif blocked:
        phase, message = BACKOFF_PHASE, f"{ready}/{desired} replicas ready; {pending_message}"
    elif pending_message:
        phase, message = "Pending", f"{ready}/{desired} replicas ready; {pending_message}"
    elif ready >= desired and count == desired:
        phase, message = "Ready", f"{ready}/{desired} replicas ready"
    else:
        phase, message = "Progressing", f"{ready}/{desired} replicas ready; waiting for health"
    if desired == 0 and not live:
        phase, message = "Ready", "scaled to 0 replicas"
    if notes:
        message += "; " + "; ".join(notes)
    out.actions.append(SetStatus(phase, message, ready, count, crash.failures, crash.last_failure,
                                 crash.last_failure_at))
    return out


def drain_done(r: Replica, now: float, drained: Collection[str]) -> str:
    """Why a draining replica may be deleted now, or "" while it must wait."""
    if r.replica_id in drained:
        return "drained: no requests running or waiting"
    if r.drain_deadline is not None and now >= r.drain_deadline:
        return "drain grace elapsed"
    return ""


def plan_deletion(replicas: Sequence[Replica], ready_ids: Collection[str], now: float, grace_s: float,
                  drained: Collection[str] = ()) -> list[Action]:
    """A deployment being deleted: ready replicas drain (weight 0, wait for in-flight work or the
    grace), the others go at once; the record goes when no replica is left (the applier)."""
    actions: list[Action] = []
    for r in sorted(replicas, key=lambda r: r.ordinal):
        if r.phase == "Deleting":
            continue
        if r.draining:
            done = drain_done(r, now, drained)
            if done:
                actions.append(DeleteReplica(r.replica_id, f"deployment deleted; {done}"))
        elif r.replica_id in ready_ids:
            actions.append(StartDrain(r.replica_id, now + grace_s, "deployment deleted"))
        else:
            actions.append(DeleteReplica(r.replica_id, "deployment deleted; it was not ready"))
    return actions


def replica_work(replicas: Sequence[Replica], observations: Mapping[str, ReplicaObservation],
                 now: float) -> dict[str, float]:
    """replica id -> requests running + waiting in its last ok scrape within the routing window."""
    out = {}
    for r in replicas:
        o = observations.get(r.replica_id)
        if o is not None and o.ok and now - o.scraped_at <= MAX_SCRAPE_AGE_S:
            out[r.replica_id] = o.running + o.queue_depth
    return out


def drained_replicas(replicas: Sequence[Replica], observations: Mapping[str, ReplicaObservation],
                     now: float, settle_s: float) -> set[str]:
    """Draining replicas whose engine reported nothing running or waiting in an ok scrape taken
    at least ``settle_s`` after the drain started (after their weight 0 reached the agents)."""
    out = set()
    for r in replicas:
        o = observations.get(r.replica_id)
        if (r.draining and r.drain_started is not None and o is not None and o.ok
                and o.scraped_at >= r.drain_started + settle_s and now - o.scraped_at <= MAX_SCRAPE_AGE_S
                and o.running == 0 and o.queue_depth == 0):
            out.add(r.replica_id)
    return out
