"""fabricd's background controllers: `start(state) -> handle`, `handle.stop()`.

One thread runs an asyncio loop with five periodic jobs, all leader-only:
  reconcile  every FABRIC_RECONCILE_SECS (15 s) and soon after a deployment or endpoint changes
             (a store.watch long-poll wakes it): replicas, health, scale, drain, delete;
  routing    every FABRIC_ROUTING_SECS (10 s): scrape /metrics, advance rollouts
             (controlplane.rollouts), weights, VIPs, Maglev pushes; a changed rollout record
             (an operator's promote, pause or rollback) runs it at once;
  models     every FABRIC_MODEL_JOBS_SECS (2 s): drive unfinished model jobs on the agents
             (controlplane.models.worker); a job turning Ready wakes the reconcile job;
  autoscale  every FABRIC_AUTOSCALE_SECS (15 s): controlplane.scaling decides each autoscaled
             deployment's replica count from the stored observations;
  (FABRIC_DRY_RUN=1: reconcile is controlplane.dryrun's synthetic replicas and there is no sweep)
  sweep      with each reconcile: replicas of deployments that no longer exist, GPU reservations
             with no replica record, and Fabric-recorded VMs with no replica record. Only what
             Fabric recorded as its own is touched.
Leadership is common.store.locks.LeaseLock on keyspace.locks("orchestration"): a key created
with a store lease (TTL FABRIC_LEADER_TTL_SECS, 15 s) that a keeper thread (LeaseKeeper)
refreshes every TTL/3, off the event loop: no pass, however long it holds the loop, delays it;
a loop wedged for LOOP_STALL_S lets it go. A process that does not hold it only retries taking it.
Every leader-only side effect is fenced by the lease: the workers get a FencedStore and
FencedAgents instead of the store and the agent clients, so each store write (replica records,
GPU reservations, managed records, deployment and endpoint status, VIPs, observations) and each
agent call checks ``lock.held()`` right before it happens; a process whose lease expired or was
taken over raises LeaseLost there, which ends the pass with nothing more written. GPU/VIP
create-if-absent stays the guard for the instant between that check and the write. A newly
taken lease forgets what the routing job pushed, since another leader may have pushed since.
Transient errors are logged and retried next period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from prometheus_client import Counter, Gauge

from common import keyspace
from common.errors import FabricError, TransientError
from common.records import gpu_reservations, managed
from common.records.events import EventSink
from common.store.base import Store
from common.store.locks import FencedStore, LeaseLock, LeaseLost
from controlplane.dryrun.worker import DryRunWorker
from controlplane.models.worker import ModelWorker
from controlplane.orchestration_state import load_snapshot
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from controlplane.reconcile.crashloop import CrashLoopSettings
from controlplane.reconcile.events import ReconcileEvents
from controlplane.rollouts.apply import RolloutMetrics, RolloutWorker
from controlplane.routing.controller import RoutingWorker
from controlplane.scaling.loop import AutoscaleWorker
from controlplane.settings import ControllerSettings
from controlplane.tenancy.notifier import NotifyWorker

log = logging.getLogger("fabricd.controllers")
LEADER_NAME = "orchestration"
LEADER_KEY = keyspace.locks(LEADER_NAME)
WAKE_GAP_S = 1.0
# A loop that has not come round for this long is wedged, not busy: the longest measured pass
# (bench-scale, 1,000 nodes on etcd, the first routing pass) takes about 10-30 s.
LOOP_STALL_S = 300.0


class ControllerMetrics:
    def __init__(self, registry):
        self.ticks = Counter("fabric_controller_ticks_total", "Controller passes by controller and outcome",
                             # not "job": Prometheus keeps that name for the scrape job and
                             # would rename ours to exported_job
                             ["controller", "outcome"], registry=registry)
        self.scrape_failures = Counter("fabric_routing_scrape_failures_total",
                                       "Replica /metrics scrapes that failed", registry=registry)
        self.maglev_pushes = Counter("fabric_routing_maglev_pushes_total",
                                     "Maglev service puts sent to agents (only on change)", registry=registry)
        self.weight = Gauge("fabric_routing_weight", "Current Maglev weight per endpoint replica",
                            ["endpoint", "replica"], registry=registry)
        self.autoscale_decisions = Counter("fabric_autoscaler_decisions_total",
                                           "Autoscaler decisions applied or recorded, by action and code",
                                           ["action", "code"], registry=registry)
        self.leader = Gauge("fabric_controller_leader", "1 while this process holds the orchestration lease",
                            registry=registry)
        # Counted where the gauge would miss it: a lease lost and retaken between two scrapes
        # (FabricLeaderFlapping, docs/dashboards/fabric-alerts.yml).
        self.leader_changes = Counter("fabric_controller_leader_changes_total",
                                      "Times this process took or lost the orchestration lease", ["change"],
                                      registry=registry)
        self.rollouts = RolloutMetrics(registry)
        self.model_jobs = Gauge("fabric_model_jobs", "Model jobs by state (one per model and node)", ["state"],
                                registry=registry)
        self.crashloop = Gauge("fabric_deployment_crashloop", "1 while the deployment is parked in CrashLoop",
                               ["deployment"], registry=registry)


def leader_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def lead(lock: LeaseLock) -> bool:
    """Refresh the lease we hold, or try to take the lock; True while we hold it."""
    if lock.lease_id is not None and lock.keep_alive():
        return True
    return lock.try_acquire()


class LeaseKeeper:
    """Refreshes the leader lease every ``period`` (or retries taking the lock) on its own thread.

    Never on the event loop: a pass that holds the loop (a long synchronous stretch, a slow
    store call) cannot starve the refresh, so it cannot cost the leadership either. But a loop
    that is wedged (an await that never ends, a call that never returns) must not lead forever
    from a thread that still runs: the loop calls ``beat()`` each time round, and once it has not
    for ``stall_after_s`` the keeper lets the lock go (another fabricd takes over) and takes it
    again only after the next beat. An unexpected error in one refresh is logged and retried,
    never the end of the thread (that would leave this process unable ever to lead again).
    ``on_change(leading, lock)`` is called from this thread when leadership is taken or lost."""

    def __init__(self, lock: LeaseLock, period: float, on_change: Callable[[bool, LeaseLock], None],
                 *, stall_after_s: float = LOOP_STALL_S):
        self.lock, self.period, self.on_change = lock, period, on_change
        self.stall_after_s = stall_after_s
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fabric-lease-keeper", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def beat(self) -> None:
        """The controllers' loop is alive (called from its thread each time round)."""
        self._beat = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            was = self.lock.held()
            try:
                leading = self._keep()
            except FabricError as exc:
                log.warning("leadership check failed: %s", exc.message)
                leading = self.lock.held()  # the local clock still bounds how long we may act
            except Exception:  # a bug here must not end the thread: the next period tries again
                log.exception("leadership check failed")
                leading = self.lock.held()
            if leading != was:
                try:
                    self.on_change(leading, self.lock)
                except Exception:
                    log.exception("leadership change report failed")
            self._stop.wait(self.period)

    def _keep(self) -> bool:
        stalled = time.monotonic() - self._beat
        if stalled <= self.stall_after_s:
            return lead(self.lock)
        if self.lock.lease_id is not None:
            log.error("the controllers' loop has not come round for %.0fs (over %.0fs): letting the "
                      "orchestration lock go until it does", stalled, self.stall_after_s)
            self.lock.release()
        return False


class FencedAgent:
    """One agent client whose calls happen only while the lock is held (see FencedStore)."""

    def __init__(self, client, lock: LeaseLock):
        self._client, self._lock = client, lock

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        async def fenced(*args, **kwargs):
            self._lock.check(f"agent call {name}")
            return await attr(*args, **kwargs)

        return fenced


class FencedAgents:
    """The AgentClients factory with every call fenced by the leader lock."""

    def __init__(self, agents, lock: LeaseLock):
        self.inner, self.lock = agents, lock

    def for_node(self, node) -> FencedAgent:
        return FencedAgent(self.inner.for_node(node), self.lock)


async def sweep(store: Store, worker: ReconcileWorker) -> None:
    """Remove what Fabric created for things that no longer exist."""
    snap = load_snapshot(store)
    errors: list[str] = []
    live_ids = {r.replica_id for r in snap.all_replicas()}
    for dep_name, reps in snap.replicas.items():
        if dep_name not in snap.deployments:
            for r in reps:
                await worker.teardown(r, snap.nodes.get(r.node), "its deployment no longer exists", errors)
    for res in snap.reservations:
        if res.replica_id in live_ids:
            continue
        node = snap.nodes.get(res.node)
        try:
            if node is not None:
                await worker.agent(node).release_gpu(res.pci)
            gpu_reservations.release(store, res.node, res.pci, mod_revision=res.mod_revision)
        except FabricError as exc:
            errors.append(f"orphan reservation {res.node}/{res.pci}: {exc.message}")
    for node_id, vm_id, mod_revision in managed.vms(store):
        if vm_id in live_ids:
            continue
        node = snap.nodes.get(node_id)
        try:
            if node is not None:
                await worker.agent(node).delete_vm(vm_id)
            managed.forget_vm(store, node_id, vm_id, mod_revision)
        except FabricError as exc:
            errors.append(f"orphan VM {vm_id} on {node_id}: {exc.message}")
    for e in errors:
        log.warning("sweep: %s", e)


class ControllerHandle:
    def __init__(self, state, settings: ControllerSettings, agents=None):
        self.state = state
        self.settings = settings
        self.metrics = ControllerMetrics(state.registry)
        if agents is None:
            from controlplane.agent_client import AgentClients

            agents = AgentClients(state.state_dir, insecure=state.settings.insecure)
        self.agents = agents
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self.lock: LeaseLock | None = None  # set once the loop runs (tests read it)
        self._thread = threading.Thread(target=self._run, name="fabric-controllers", daemon=True)
        self._watchers = [
            threading.Thread(target=self._watch, args=(prefix,), name=f"fabric-watch{prefix}", daemon=True)
            for prefix in (keyspace.deployments(), keyspace.endpoints(), keyspace.rollouts())
        ]
        self._route_now = False  # a rollout record changed: run the routing job on the next wake

    def start(self) -> ControllerHandle:
        self._thread.start()
        for w in self._watchers:
            w.start()
        return self

    def _poke(self) -> None:
        """Wake the loop from another thread; a no-op once the loop has ended (stopping)."""
        if self._loop is not None and self._wake is not None:
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the event loop is closed
                pass

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._poke()
        self._thread.join(timeout)
        for w in self._watchers:
            w.join(timeout)

    def _watch(self, prefix: str) -> None:
        """Wake the reconcile job soon after a spec changes."""
        store: Store = self.state.store
        after = store.revision()
        while not self._stop.is_set():
            try:
                events = store.watch(prefix, after, timeout=2.0)
            except FabricError:
                self._stop.wait(1.0)
                continue
            if events:
                after = max(e.revision for e in events)
                if prefix == keyspace.rollouts():
                    self._route_now = True
                self._poke()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        raw: Store = self.state.store
        lock = LeaseLock(raw, LEADER_NAME, holder=leader_identity(), ttl=self.settings.leader_ttl_s)
        self.lock = lock
        store, agents = FencedStore(raw, lock), FencedAgents(self.agents, lock)
        config = self.state.settings  # the process's FabricdSettings, read at start
        events = EventSink(store, keep=config.events_kept, max_age_s=config.events_max_age_s)
        if self.settings.dry_run:
            log.info("FABRIC_DRY_RUN=1: no agents; every deployment gets synthetic replicas")
            reconcile = DryRunWorker(store)
        else:
            cs = self.settings
            reconcile = ReconcileWorker(store, agents, rp.ReconcileSettings(
                drain_grace_s=cs.drain_grace_s, start_timeout_s=cs.start_timeout_s,
                # weight 0 reaches the agents within a routing pass, and the gateways' replica views
                # (refreshed every 1 s: gateway/upstreams.py ttl_secs) within a second more
                drain_settle_s=cs.routing_s + 2,
                health_timeout_s=cs.health_timeout_s,
                scheduler=config.scheduler,
                crashloop=CrashLoopSettings(cs.crashloop_after, cs.crashloop_backoff_s, cs.crashloop_backoff_max_s,
                                            cs.crashloop_reset_s),
                deny_runtimes=config.deny_runtimes, allow_runtimes=config.allow_runtimes),
                events=ReconcileEvents(events), crashloop_gauge=self.metrics.crashloop)
        rollouts = RolloutWorker(store, events_kept=config.events_kept, metrics=self.metrics.rollouts)
        routing = RoutingWorker(store, agents, config.pool,
                                metrics=self.metrics, rollouts=rollouts, events=events, stall_s=self.settings.stall_s,
                                drain_grace_s=self.settings.drain_grace_s,
                                scrape_timeout_s=self.settings.scrape_timeout_s)
        models = ModelWorker(store, agents, jobs_gauge=self.metrics.model_jobs)
        autoscale = AutoscaleWorker(store, events=events, metrics=self.metrics)
        notify = NotifyWorker(store, alerts=config.notify_alerts, retention_s=config.usage_retention_s)
        keeper = LeaseKeeper(lock, max(0.1, self.settings.leader_ttl_s / 3), self._leadership_changed).start()
        next_reconcile = next_routing = last_reconcile = last_routing = next_models = next_autoscale = next_notify = 0.0
        fence_seen: int | None = None
        try:
            while not self._stop.is_set():
                keeper.beat()
                now = time.monotonic()
                if self._wake.is_set():
                    # Our own status writes also wake us: at most one extra pass per WAKE_GAP_S.
                    self._wake.clear()
                    if self._route_now:  # at most one extra routing pass per WAKE_GAP_S
                        self._route_now = False
                        next_routing = min(next_routing, last_routing + WAKE_GAP_S)
                    next_reconcile = min(next_reconcile, last_reconcile + min(WAKE_GAP_S, self.settings.reconcile_s))
                if lock.held() and lock.fence != fence_seen:
                    # Newly leader: what we pushed before may have been replaced by another leader.
                    fence_seen = lock.fence
                    routing.forget_pushes()
                    next_reconcile = next_routing = next_autoscale = now
                if now >= next_reconcile and lock.held():
                    last_reconcile = now
                    await self._job("reconcile", lock, reconcile.tick)
                    if not self.settings.dry_run:  # nothing was placed on an agent to sweep
                        await self._job("sweep", lock, lambda: sweep(store, reconcile))
                    # A reconcile that changed replicas wants fresh weights soon.
                    next_routing = min(next_routing, time.monotonic() + 1.0)
                    next_reconcile = time.monotonic() + self.settings.reconcile_s
                    retry_at = reconcile.next_retry_at()
                    if retry_at is not None:  # an agent in backoff: try it again when its wait ends
                        next_reconcile = min(next_reconcile, time.monotonic() + max(0.0, retry_at - time.time()))
                if time.monotonic() >= next_routing and lock.held():
                    last_routing = time.monotonic()
                    await self._job("routing", lock, routing.tick)
                    next_routing = time.monotonic() + self.settings.routing_s
                if time.monotonic() >= next_models and lock.held():
                    await self._job("models", lock, models.tick)
                    next_models = time.monotonic() + self.settings.models_s
                    if models.became_ready:  # replicas waiting for that model can start now
                        next_reconcile = min(next_reconcile, time.monotonic())
                if time.monotonic() >= next_autoscale and lock.held():
                    await self._job("autoscale", lock, autoscale.tick)
                    next_autoscale = time.monotonic() + self.settings.autoscale_s
                    due = autoscale.next_due()  # a condition completes its hold before the next period
                    if due is not None:
                        next_autoscale = min(next_autoscale, time.monotonic() + max(0.05, due - time.time()))
                if time.monotonic() >= next_notify and lock.held():  # budgets, alerts, webhooks, ledger
                    await self._job("notify", lock, notify.tick)
                    next_notify = time.monotonic() + config.notify_s
                # Not leading: the keeper wakes us when we take the lock.
                horizon = (min(next_reconcile, next_routing, next_models, next_autoscale, next_notify) if lock.held()
                           else now + self.settings.leader_ttl_s)
                wait = max(0.05, horizon - time.monotonic())
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=wait)
                except asyncio.TimeoutError:  # not the builtin TimeoutError on Python 3.10
                    pass
        finally:
            keeper.stop()  # before the release: a refresh racing it could outlive it
            try:
                lock.release()
            except FabricError as exc:
                log.warning("could not release the leader lock: %s", exc.message)
            self.metrics.leader.set(0)
            await reconcile.aclose()
            await routing.aclose()
            await notify.aclose()
            closer = getattr(self.agents, "aclose", None)
            if closer is not None:
                await closer()

    def _leadership_changed(self, leading: bool, lock: LeaseLock) -> None:
        """The keeper's report (its own thread): metrics, a log line, and a wake of the loop."""
        self.metrics.leader.set(1 if leading else 0)
        log.info("%s the orchestration lock (fence %s)", "took" if leading else "lost", lock.fence)
        self.metrics.leader_changes.labels("took" if leading else "lost").inc()
        self._poke()

    async def _job(self, name: str, lock: LeaseLock, fn) -> None:
        if not lock.held():
            self.metrics.ticks.labels(name, "not_leader").inc()
            return
        try:
            await fn()
            self.metrics.ticks.labels(name, "ok").inc()
        except LeaseLost as exc:
            # Lease expired or taken over mid-pass: stop here; nothing after this was written.
            self.metrics.ticks.labels(name, "lease_lost").inc()
            log.warning("%s stopped: %s", name, exc)
        except TransientError as exc:
            self.metrics.ticks.labels(name, "transient").inc()
            log.warning("%s: %s", name, exc.message)
        except Exception:  # a bug in one pass must not kill the loop; it is logged with its trace
            self.metrics.ticks.labels(name, "error").inc()
            log.exception("%s pass failed", name)


def start(state, *, settings: ControllerSettings | None = None, agents=None) -> ControllerHandle:
    settings = settings or state.settings.controllers
    return ControllerHandle(state, settings, agents).start()
