"""Applies reconcile plans: probes health, creates and tears down replicas through the agents.

Ordering invariants (each step is safe to repeat after a crash or restart):
  create:   replica record (Pending) -> GPU reservations with create-if-absent -> agent binds ->
            managed-VM record -> agent creates the VM -> record gets host/port (Starting);
            Ready only when the plan sees GET /health answer (probed from here, or by the node's
            agent where it observes the replica: ``probe_all``).
  teardown: agent deletes the VM -> agent releases each GPU -> reservation removed (only after a
            successful release) -> replica record and observation removed. An unreachable agent
            leaves the replica in phase Deleting, retried next tick.
Unreachable agents: every agent call goes through controlplane.reconcile.backoff (per node: 1, 2,
4 ... 60 s after consecutive failures, reset by any answer); while a node waits its agent is not
called and the deployment stays Pending with the retry message (which agent, the last error,
when the next try is). ``next_retry_at()`` tells the loop when to run the next pass.
The deployment status message always says why (agent unreachable, no node fits, ...).

Failures: a replica whose probe gets no answer is looked up on its agent; a VM or engine that
has ended gives the engine's own last error line (controlplane.reconcile.engine_failure) and the
plan makes it Failed; a replica waiting for a model job that failed gets the job's message. Both
count toward the deployment's crash loop (controlplane.reconcile.crashloop), which records an
event and the metric fabric_deployment_crashloop (1 while parked) when it parks.

Concurrency: up to ``CONCURRENCY`` (4) deployments are reconciled at once, each under its own
lock (a deployment is never worked on by two passes at a time). A plan is computed without
awaiting anything, and the replicas it will create (with their GPUs) are entered into the shared
snapshot right away, so a deployment planned next sees them placed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from common.agent_api import VmCreateRequest, VmInfo
from common.engine_metrics.material import MAX_SCRAPE_AGE_S
from common.engine_metrics.scrape import MetricsScraper, ScrapeError
from common.errors import FabricError, TransientError
from common.records import autoscaling, deployments, gpu_reservations, managed, observations
from common.records import rollouts as rollout_records
from common.records.events import EventSink
from common.runtimes import health_path
from common.schemas import InferenceDeployment, Node, Replica, ReplicaObservation, runtime_refusal
from common.store.base import Store
from controlplane.models.gate import model_gate
from controlplane.node_trust import replica_host_refusal
from controlplane.orchestration_state import (
    ParseCache,
    Reservation,
    Snapshot,
    delete_replica,
    get_replica,
    load_snapshot,
    put_replica,
    update_deployment_status,
)
from controlplane.placement import vip_pool
from controlplane.reconcile import plan as rp
from controlplane.reconcile import preempt_apply
from controlplane.reconcile.backoff import AgentBackoff, BackoffAgent
from controlplane.reconcile.crashloop import CRASHLOOP_PHASE
from controlplane.reconcile.engine_failure import engine_error_line
from controlplane.reconcile.events import ReconcileEvents
from controlplane.scaling.loop import with_note

log = logging.getLogger("fabricd.reconcile")
CONCURRENCY = 4
PROBE_CONCURRENCY = 64  # /health probes in flight at once
LOG_TAIL_BYTES = 16384


reserve_gpus = gpu_reservations.reserve  # the name the tests and callers use


def reported_probe(obs: ReplicaObservation | None, now: float, node: str) -> rp.Probe:
    """The health probe an agent reported with ``obs`` (agent.engine_watch). None, not probed, or
    older than the observations' eligibility window (a silent agent) is unknown health: a failed
    probe without an answer, as a probe from here that got none."""
    if obs is None or obs.health is None or now - obs.scraped_at > MAX_SCRAPE_AGE_S:
        return rp.Probe(False, f"no health report from node {node}'s agent in the last {MAX_SCRAPE_AGE_S:.0f}s")
    if obs.health == 0:
        return rp.Probe(False, obs.health_error or "no answer")
    return rp.Probe(obs.health == 200, f"HTTP {obs.health}", answered=True)


class ReconcileWorker:
    """One reconcile pass over every deployment. ``agents`` is an AgentClients-like factory
    (``for_node(node)`` returning an async agent client)."""

    def __init__(self, store: Store, agents, settings: rp.ReconcileSettings, *,
                 clock: Callable[[], float] = time.time, on_tick: Callable[[str], None] | None = None,
                 events: ReconcileEvents | None = None, crashloop_gauge=None):
        self.store = store
        self.crashloop_gauge = crashloop_gauge  # Gauge fabric_deployment_crashloop{deployment}
        self._locks: dict[str, asyncio.Lock] = {}
        self._model_state: dict[str, tuple[bool, str]] = {}  # replica -> (job failed, message) this pass
        self.agents = agents
        self.settings = settings
        self.clock = clock
        self.on_tick = on_tick or (lambda outcome: None)
        self.backoff = AgentBackoff(clock=clock)
        self.events = events or ReconcileEvents(EventSink(store))
        self._parsed = ParseCache()  # replicas and observations by mod_revision: unchanged ones not validated again
        # the pass's VM lists, by node, for the snapshot they were asked under (vm_failures)
        self._vm_lists: tuple[Snapshot | None, dict[str, asyncio.Future[dict[str, VmInfo] | None]]] = (None, {})
        # The engines' HTTP/1.1 client (common.engine_metrics.scrape: a kept-alive connection per
        # engine, a semaphore), not one pooled httpx client whose bookkeeping grows with the fleet.
        self._engines = MetricsScraper(timeout_s=settings.health_timeout_s, concurrency=PROBE_CONCURRENCY)

    def agent(self, node: Node) -> BackoffAgent:
        """The node's agent client, behind its backoff (see controlplane.reconcile.backoff)."""
        return BackoffAgent(self.agents.for_node(node), node.id, self.backoff)

    def next_retry_at(self) -> float | None:
        """When the earliest agent in backoff may be tried again (wall clock), or None."""
        return self.backoff.next_try_at()

    async def aclose(self) -> None:
        await self._engines.aclose()

    # -- probes -----------------------------------------------------------------------------------
    # A replica its node's agent observes (common.engine_metrics.reported) gets the agent's probe,
    # read from its observation; the others are probed from here.

    async def _probe(self, r: Replica) -> rp.Probe | None:
        if not r.host:
            return None
        try:
            status = await self._engines.probe(r.host, r.port, health_path(r.runtime))
        except ScrapeError as exc:
            return rp.Probe(False, str(exc)[:200])
        return rp.Probe(status == 200, f"HTTP {status}", answered=True)

    async def probe_all(self, snap: Snapshot, replicas: list[Replica]) -> dict[str, rp.Probe]:
        """This pass's health of each live replica: what its node's agent probed (Node.observed_replicas,
        read from its stored observation: no connection from here), a GET /health from here otherwise.
        A replica its agent names whose stored observation carries no probe was last scraped by
        fabricd itself (the routing pass scraped it while its snapshot did not yet list the agent's
        report, and wrote over it): probed from here, never failed for want of a report."""
        live = [r for r in replicas if r.phase != "Deleting" and not r.draining]
        by_agent = {rid for rid in snap.agent_observed(live)
                    if (o := snap.observations.get(rid)) is None or o.health is not None}
        now = self.clock()
        probed = [r for r in live if r.replica_id not in by_agent]
        results = await asyncio.gather(*(self._probe(r) for r in probed))
        out = {r.replica_id: reported_probe(snap.observations.get(r.replica_id), now, r.node)
               for r in live if r.replica_id in by_agent and r.host}
        out.update({r.replica_id: p for r, p in zip(probed, results) if p is not None})
        return out

    # -- one tick ---------------------------------------------------------------------------------

    async def vm_failures(self, snap: Snapshot, replicas: list[Replica],
                          probes: dict[str, rp.Probe]) -> dict[str, str]:
        """replica -> the engine's last error line, for replicas whose probe got no answer and
        whose VM (engine process) their node's agent lists as failed or stopped. Each node is
        asked once a pass (GET /v1/vms, shared by every deployment of the pass, the nodes at
        once), not once per replica: when a fleet's health reports all go stale together the
        pass asks a thousand agents once each, not eight thousand times one after another."""
        asked = [r for r in replicas if (p := probes.get(r.replica_id)) is not None and not p.ok
                 and not p.answered and not r.draining and r.node in snap.nodes]
        nodes = sorted({r.node for r in asked})
        listed = dict(zip(nodes, await asyncio.gather(*(self._vms_of(snap, snap.nodes[n]) for n in nodes))))
        out: dict[str, str] = {}
        for r in asked:
            vm = (listed[r.node] or {}).get(r.replica_id)
            if vm is None or vm.state not in ("failed", "stopped"):
                continue  # running, gone or unknown: the health rules decide as before
            try:
                tail = (await self.agent(snap.nodes[r.node]).vm_logs(r.replica_id, -LOG_TAIL_BYTES,
                                                                      LOG_TAIL_BYTES)).get("text", "")
            except (FabricError, AttributeError, ValueError):
                tail = ""
            out[r.replica_id] = engine_error_line(tail) if tail else vm.message or f"VM {vm.state}"
        return out

    def _vms_of(self, snap: Snapshot, node: Node) -> asyncio.Future[dict[str, VmInfo] | None]:
        """The node's VMs by id as its agent lists them this pass (None: the agent did not
        answer), one request per node per snapshot whichever deployments ask."""
        if self._vm_lists[0] is not snap:
            self._vm_lists = (snap, {})
        asks = self._vm_lists[1]
        if node.id not in asks:
            asks[node.id] = asyncio.ensure_future(self._list_vms(node))
        return asks[node.id]

    async def _list_vms(self, node: Node) -> dict[str, VmInfo] | None:
        try:
            return {vm.id: vm for vm in await self.agent(node).list_vms()}
        except (FabricError, AttributeError):
            return None

    async def tick(self) -> None:
        snap = load_snapshot(self.store, self._parsed)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(name: str) -> None:
            lock = self._locks.setdefault(name, asyncio.Lock())
            async with gate, lock:
                try:
                    await self.reconcile(snap, snap.deployments[name])
                except FabricError as exc:
                    update_deployment_status(self.store, name, phase="Pending", message=exc.message)

        results = await asyncio.gather(*(one(name) for name in sorted(snap.deployments)), return_exceptions=True)
        for name in [n for n in self._locks if n not in snap.deployments]:
            del self._locks[name]
        for result in results:
            if isinstance(result, BaseException):
                raise result  # LeaseLost or a bug: after every sibling finished
        self.on_tick("ok")

    async def reconcile(self, snap: Snapshot, dep: InferenceDeployment) -> None:
        replicas = snap.replicas.get(dep.name, [])
        node_of = snap.nodes
        errors: list[str] = []
        # Retry teardowns left over from an unreachable agent before planning anything new.
        for r in [r for r in replicas if r.phase == "Deleting"]:
            await self.teardown(r, node_of.get(r.node), "retrying deletion", errors)
        now = self.clock()
        drained = rp.drained_replicas(replicas, snap.observations, now, self.settings.drain_settle_s)
        if dep.status.phase == "Deleting":
            await self.delete_deployment(snap, dep, replicas, drained, errors)
            return
        profile = snap.profiles.get(dep.profile)
        refusal = (runtime_refusal(profile.runtime, self.settings.deny_runtimes, self.settings.allow_runtimes)
                   if profile is not None else None)
        if refusal is not None:  # existing replicas are left as they are; nothing new starts
            ready = sum(1 for r in replicas if r.ready)
            update_deployment_status(self.store, dep.name, phase="Failed", message=refusal,
                                     ready_replicas=ready, replicas=len(replicas))
            return
        resumed = {r.replica_id for r in replicas if r.phase == "Pending" and not r.host}
        for r in [r for r in replicas if r.replica_id in resumed]:
            await self.resume_create(snap, dep, r, errors)
        # what the resumes wrote (the others are as the pass's snapshot read them: no get per replica)
        replicas = [(get_replica(self.store, dep.name, r.replica_id) or r) if r.replica_id in resumed else r
                    for r in replicas]
        probes = await self.probe_all(snap, replicas)
        vm_failures = await self.vm_failures(snap, replicas, probes)
        model_failures = {rid: msg for rid, (failed, msg) in self._model_state.items() if failed}
        model_waits = {rid for rid, (failed, _) in self._model_state.items() if not failed}
        rollout = snap.rollouts.get(dep.name)
        targets = None
        if rollout is not None:  # the rollout planner owns the counts of both revisions
            targets = {rollout.from_revision: rollout.old_target, rollout.to_revision: rollout.new_target}
        templates = {rev: snap.template(dep, rev)[:2] for rev in snap.revisions.get(dep.name, {})}
        dep = preempt_apply.restore(self, snap, dep)  # a preempted replica back once room returned
        targets = preempt_apply.targets(dep, targets)
        nodes, cap = list(node_of.values()), snap.capacity()  # computed once per pass, held current below
        plan = rp.plan(dep, snap.profiles.get(dep.profile), snap.models.get(dep.model), replicas,
                       nodes, probes, self.clock(), reservations=cap.reserved,
                       committed=cap.committed, settings=self.settings, targets=targets, templates=templates,
                       work=rp.replica_work(replicas, snap.observations, now), drained=drained,
                       sites=snap.sites, vm_failures=vm_failures,
                       model_failures={k: v for k, v in model_failures.items() if k in {r.replica_id for r in replicas}},
                       model_waits=model_waits,
                       placement=lambda: cap.placement(nodes, now, self.settings.scheduler, snap.sites))
        for rid in [r.replica_id for r in replicas]:
            self._model_state.pop(rid, None)
        self._hold_planned(snap, dep, plan)
        by_id = {r.replica_id: r for r in replicas}
        for action in plan.actions:
            if isinstance(action, rp.UpdateHealth):
                self.events.health(dep, by_id.get(action.replica_id), action)
                since = {"ready_since": action.ready_since} if action.ready_since or not action.ready else {}
                self._update(dep.name, action.replica_id, ready=action.ready, **since,
                             health_failures=action.health_failures, phase=action.phase, message=action.message)
            elif isinstance(action, (rp.StartDrain, rp.DeleteReplica)):
                await self._remove(dep, by_id[action.replica_id], action, node_of, errors)
            elif isinstance(action, rp.FailReplica):
                self.events.replica(dep, action.replica_id, "ReplicaFailed", action.reason, warning=True)
                self._update(dep.name, action.replica_id, phase="Failed", ready=False, message=action.reason)
                await self.teardown(by_id[action.replica_id], node_of.get(by_id[action.replica_id].node),
                                    action.reason, errors)
            elif isinstance(action, rp.CreateReplica):
                await self.create(snap, dep, action, errors)
            elif isinstance(action, rp.SetStatus):
                # Several replicas waiting on one agent give the same message once.
                message = action.message + (f"; {'; '.join(dict.fromkeys(errors))}" if errors else "")
                phase = action.phase
                if errors and phase not in ("Failed",):
                    phase = "Pending" if action.ready_replicas < dep.replicas else phase
                update_deployment_status(self.store, dep.name, phase=phase,
                                         message=with_note(message, dep.status.scaling),
                                         ready_replicas=action.ready_replicas, replicas=action.replicas,
                                         failures=action.failures, last_failure=action.last_failure,
                                         last_failure_at=action.last_failure_at)
                self._crashloop(dep, action)
        await preempt_apply.after_plan(self, snap, dep, plan, errors)  # capacity classes (docs/capacity.md)

    def _crashloop(self, dep: InferenceDeployment, status: rp.SetStatus) -> None:
        parked = status.phase == CRASHLOOP_PHASE
        if parked and dep.status.phase != CRASHLOOP_PHASE:
            self.events.deployment(dep, "CrashLoop", status.message, warning=True)
            log.warning("deployment %s parked: %s", dep.name, status.message)
        if self.crashloop_gauge is not None:
            self.crashloop_gauge.labels(dep.name).set(1 if parked else 0)

    def forget_deployment(self, name: str) -> None:
        """Drop the per-deployment series of a deleted deployment."""
        if self.crashloop_gauge is not None:
            try:
                self.crashloop_gauge.remove(name)
            except KeyError:
                pass

    @staticmethod
    def _hold_planned(snap: Snapshot, dep: InferenceDeployment, plan: rp.ReconcilePlan) -> None:
        """Enter the replicas the plan will create into the shared snapshot (and its per-pass
        capacity) before anything is awaited, so deployments planned concurrently see their GPUs,
        CPU and memory taken."""
        for a in plan.actions:
            if isinstance(a, rp.CreateReplica):
                snap.hold(Replica(replica_id=f"planned-{dep.name}-{a.ordinal}", deployment=dep.name,
                                  ordinal=a.ordinal, revision=a.revision, node=a.node, gpus=list(a.gpus),
                                  phase="Pending"))

    async def _remove(self, dep: InferenceDeployment, r: Replica, action, node_of, errors: list[str]) -> None:
        """StartDrain (weight 0 from the next routing tick) or DeleteReplica (teardown)."""
        if isinstance(action, rp.StartDrain):
            self.events.replica(dep, r.replica_id, "DrainStarted", f"{action.reason}; deleted when idle or "
                                f"after the grace ({action.deadline - self.clock():.0f}s)")
            self._update(dep.name, r.replica_id, draining=True, drain_started=self.clock(),
                         drain_deadline=action.deadline, phase="Draining", message=action.reason)
            return
        if await self.teardown(r, node_of.get(r.node), action.reason, errors):
            warn = "health failed" in action.reason or "not ready after" in action.reason
            self.events.replica(dep, r.replica_id, "ReplicaReplaced" if warn else "ReplicaDeleted", action.reason,
                                warning=warn)

    async def delete_deployment(self, snap: Snapshot, dep: InferenceDeployment, replicas: list[Replica],
                                drained: set[str], errors: list[str]) -> None:
        """Drain ready replicas (weight 0, in-flight work or the grace), remove the rest, then the record."""
        probes = await self.probe_all(snap, replicas)
        ready_ids = {rid for rid, p in probes.items() if p.ok}
        by_id = {r.replica_id: r for r in replicas}
        for action in rp.plan_deletion(replicas, ready_ids, self.clock(), self.settings.drain_grace_s, drained):
            await self._remove(dep, by_id[action.replica_id], action, snap.nodes, errors)
        left = [r for r in replicas if get_replica(self.store, dep.name, r.replica_id) is not None]
        if not left and not errors:
            deployments.discard(self.store, dep.name)
            rollout_records.forget(self.store, dep.name)
            autoscaling.forget(self.store, dep.name)
            self.forget_deployment(dep.name)
            self.events.deployment(dep, "Deleted", f"deployment {dep.name} deleted; its replicas are gone")
            log.info("deployment %s deleted", dep.name)
            return
        draining = sum(1 for r in left if r.draining or r.replica_id in ready_ids)
        message = f"deleting: draining {draining} of {len(left)} replicas (idle or after the grace)"
        update_deployment_status(self.store, dep.name, phase="Deleting",
                                 message=message + ("; " + "; ".join(errors) if errors else ""))

    def _update(self, deployment: str, replica_id: str, **fields) -> None:
        current = get_replica(self.store, deployment, replica_id)
        if current is not None and any(getattr(current, k) != v for k, v in fields.items()):
            put_replica(self.store, current.model_copy(update=fields), self.clock())

    # -- create -----------------------------------------------------------------------------------

    async def create(self, snap: Snapshot, dep: InferenceDeployment, action: rp.CreateReplica,
                     errors: list[str]) -> None:
        profile = snap.template(dep, action.revision)[0]
        replica = Replica(replica_id=f"{dep.name}-{action.ordinal}-{secrets.token_hex(3)}", deployment=dep.name,
                          ordinal=action.ordinal, revision=action.revision, node=action.node, gpus=list(action.gpus),
                          runtime=profile.runtime if profile else "vllm",
                          phase="Pending", message=action.reason, created_at=self.clock())
        put_replica(self.store, replica, self.clock())
        if not reserve_gpus(self.store, action.node, action.gpus, replica.replica_id, dep.name, self.clock()):
            delete_replica(self.store, dep.name, replica.replica_id, self.clock())
            errors.append(f"a GPU on {action.node} was taken meanwhile; placing again next tick")
            return
        # Deployments reconciled later in this tick plan from the same snapshot: let them see the
        # CPU and memory this replica now holds on its node.
        planned = f"planned-{dep.name}-{action.ordinal}"  # what _hold_planned entered for it
        snap.replicas[dep.name] = [r for r in snap.replicas.get(dep.name, []) if r.replica_id != planned]
        snap.reservations[:] = [r for r in snap.reservations if r.replica_id != planned]
        snap.reservations.extend(Reservation(action.node, pci, replica.replica_id, dep.name, 0) for pci in action.gpus)
        snap.replicas[dep.name].append(replica)
        self.events.placed(dep, replica, action.reason)
        await self.start_vm(snap, dep, replica, errors)

    async def resume_create(self, snap: Snapshot, dep: InferenceDeployment, replica: Replica,
                            errors: list[str]) -> None:
        """Finish a create an earlier pass (or process) left at Pending: its reservations first,
        since it may have stopped between writing the record and reserving the GPUs."""
        if not reserve_gpus(self.store, replica.node, replica.gpus, replica.replica_id, dep.name, self.clock()):
            # Another replica holds one of its GPUs: this one never ran there; place it again.
            # (A VM the agent may have made for it is under /fabric/managed/vms/: the sweep removes it.)
            for pci in replica.gpus:
                if gpu_reservations.reserved_for(self.store, replica.node, pci) == replica.replica_id:
                    gpu_reservations.release(self.store, replica.node, pci)
            delete_replica(self.store, dep.name, replica.replica_id, self.clock())
            errors.append(f"a GPU of {replica.replica_id} on {replica.node} is held by another replica; "
                          "placing it again")
            return
        await self.start_vm(snap, dep, replica, errors)

    async def start_vm(self, snap: Snapshot, dep: InferenceDeployment, replica: Replica,
                       errors: list[str]) -> None:
        node = snap.nodes.get(replica.node)
        profile, model, engine_args = snap.template(dep, replica.revision)
        if node is None or profile is None or model is None:
            return
        gate = model_gate(self.store, model, node)
        if not gate.ready:
            # The VM waits for verified bytes on this node; the replica shows the job's progress.
            # A job that failed fails the replica (the plan releases its GPUs).
            self._model_state[replica.replica_id] = (gate.failed, gate.message)
            errors.append(gate.message)
            self._update(dep.name, replica.replica_id, message=gate.message)
            return
        agent = self.agent(node)
        slices = {g.pci for g in node.gpus if g.mig_profile}  # MIG slices are not bound through VFIO
        whole = [pci for pci in replica.gpus if pci not in slices]
        try:
            for pci in whole:
                await agent.bind_gpu(pci)
            managed.note_vm(self.store, node.id, replica.replica_id, dep.name)
            gpu_mib = max((g.memory_total_mib for g in node.gpus if g.pci in replica.gpus), default=0)
            dsr = vip_pool.dsr_vips(dep.name, snap.endpoints.values(), vip_pool.allocations(self.store))
            vm = await agent.create_vm(VmCreateRequest(
                replica_id=replica.replica_id, deployment=dep.name, model_name=model.name,
                model_source=model.source, runtime=profile.runtime, gpus=whole,
                mig_slices=[pci for pci in replica.gpus if pci in slices],
                gpu_memory_mib=gpu_mib, cpu=profile.cpu, memory_gib=profile.memory_gib,
                max_model_len=profile.max_model_len, extra_args=list(profile.extra_args) + engine_args,
                model_digest=gate.digest, model_tenant=model.tenant, adapter_digests=gate.adapters,
                max_loras=model.max_loaded_adapters if gate.adapters else None, dsr_vips=dsr))
        except TransientError as exc:
            errors.append(exc.message)  # names the agent, the last error and the next try
            self.events.agent_error(dep, replica.replica_id, node.id, exc, "starting the VM")
            self._update(dep.name, replica.replica_id, message=f"waiting: {exc.message}")
            return
        except FabricError as exc:
            errors.append(f"agent on {node.id} refused replica {replica.replica_id}: {exc.message}")
            self.events.replica(dep, replica.replica_id, "AgentRefused", f"agent on {node.id}: {exc.message}",
                                warning=True)
            self._update(dep.name, replica.replica_id, phase="Deleting", message=exc.message)
            return
        if why := replica_host_refusal(node, vm.host, vm.port):  # never route callers where a node points
            errors.append(why)
            self.events.replica(dep, replica.replica_id, "AgentRefused", why, warning=True)
            self._update(dep.name, replica.replica_id, vm_id=vm.id, phase="Deleting", message=why)
            return
        self._update(dep.name, replica.replica_id, vm_id=vm.id, host=vm.host, port=vm.port, dsr_vips=dsr,
                     phase="Starting", message=f"VM {vm.state} on {node.id}; waiting for /health")

    # -- teardown ---------------------------------------------------------------------------------

    async def teardown(self, r: Replica, node: Node | None, reason: str, errors: list[str]) -> bool:
        """Delete the VM, release GPUs, then drop reservations and the record. False if pending."""
        log.info("removing replica %s: %s", r.replica_id, reason)
        if node is not None:
            agent = self.agent(node)
            try:
                await agent.delete_vm(r.replica_id)
                managed.forget_vm(self.store, node.id, r.replica_id)
                for pci in r.gpus:
                    if "--" not in pci:  # a MIG slice id (PARENT--PROFILE--N) was never bound
                        await agent.release_gpu(pci)
                    gpu_reservations.release(self.store, node.id, pci)
            except FabricError as exc:
                errors.append(f"cannot remove {r.replica_id} on {node.id} yet: {exc.message}")
                if isinstance(exc, TransientError):
                    self.events.teardown_error(r, node.id, exc)
                self._update(r.deployment, r.replica_id, phase="Deleting", ready=False,
                             message=f"{reason}; waiting for agent: {exc.message}")
                return False
        else:
            # The node record is gone: nothing to release there, only our reservations.
            for pci in r.gpus:
                gpu_reservations.release(self.store, r.node, pci)
        delete_replica(self.store, r.deployment, r.replica_id, self.clock())
        observations.discard(self.store, r.replica_id)
        return True
