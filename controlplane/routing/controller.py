"""Applies routing plans: scrapes engines, records observations, owns endpoint VIPs and Maglev.

One tick reads its records from the leader's Mirror of the store (common.store.mirror: listed at
the first tick, then only the changes since the last one, fetched off the event loop): the
snapshot (load_routing_snapshot: nodes, endpoints, sites, replicas, observations), the published
plans, the managed services and the VIP owners (vip_pool.Held, once per tick, never per
endpoint), then:
  1. observe every Ready replica (draining ones too, for their running count). A replica its
     node's agent observes (Node.observed_replicas, from the heartbeat: agent.engine_watch scrapes
     it one hop away and reports what changed materially, POST /api/ai/nodes/{id}/observations)
     is read from the store: this pass opens no connection to it, and an agent that stops reporting lets
     its observations age past the 30 s window, so its replicas get weight 0 (flows kept) exactly
     as after a failed scrape. The others (the lab without agents, dry-run) are scraped here by a
     common.engine_metrics EngineObserver (the same code the agent runs: one kept-alive
     connection per engine, at most SCRAPE_CONCURRENCY in flight, scrape_timeout_s each,
     FABRIC_SCRAPE_TIMEOUT_SECS, 2 s). A failed scrape is ok=False, never zeros. The stall mark
     (routing.stall) is applied to both. The plan uses these observations directly; the store
     gets one only when it differs materially from the stored one
     (common.engine_metrics.material: the agent reports by the same rule);
  1b. advance the active rollouts (controlplane.rollouts.apply) on those fresh observations;
  2. for every endpoint: take its VIP (vip_pool.allocate, create-if-absent; an event when taken),
     record an event when its weights change, compute the routing plan (with the rollout's
     weight split, controlplane.routing.rollout_weights, and the spillover deployments' routable
     replicas) and publish it (common.records.plans) with a new generation when the decision
     moved: the exact service the agents get, the entries explain and the console show, what the
     gateway routes on;
  2b. push (controlplane.routing.push): each online balancer gets, in one request, the services whose
     generation it does not hold (by its answers and its heartbeat's report); an agent refuses an
     older generation, so a late PUT never overwrites a newer one. Nothing is re-sent on a timer.
     Each agent has its own queue and deadline: a silent one is marked and waited for no more. A
     node that is not a balancer gets nothing, and what it still holds is removed (a role change);
  3. for every VIP whose endpoint is gone: DELETE the service on every registered agent that may
     hold it (balancers, and nodes that acknowledged or report it; 404 counts as absent); only
     when all of them answered is the VIP released. An unreachable or silent agent keeps the VIP,
     retried next tick.
Those observation writes happen after step 2b's pushes, so a metric change reaches the agents
without waiting for the store, and go in one batch off the event loop; the other store writes
stay one by one (each is fenced by the leader lease right before it happens).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common import keyspace
from common.agent_api import MaglevServicePut
from common.engine_metrics.material import material_change
from common.engine_metrics.observer import EngineObserver, EngineTarget
from common.engine_metrics.scrape import MetricsScraper
from common.errors import Conflict, FabricError, Refused
from common.records import observations, plans
from common.records.events import EventRecord, EventSink, new_event
from common.records.plans import PublishedPlan, SpillPool, same_decision
from common.schemas import InferenceEndpoint, Replica, ReplicaObservation
from common.store.base import Store
from common.store.mirror import Mirror
from controlplane.history import HISTORY
from controlplane.orchestration_state import (
    MANAGED_SERVICES,
    ROUTING_PREFIXES,
    ParseCache,
    Snapshot,
    load_routing_snapshot,
    managed_service_key,
    update_endpoint_status,
)
from controlplane.placement import vip_pool
from controlplane.placement.scheduler import SchedulerSettings, node_online
from controlplane.rollouts.apply import RolloutWorker
from controlplane.routing.final import endpoint_plan
from controlplane.routing.publish import PROTO, spill_pools, to_published
from controlplane.routing.push import PUSH_DEADLINE_S, Pushes
from controlplane.routing.stall import mark, stall_since
from controlplane.routing.strategies import RoutingPlan

log = logging.getLogger("fabricd.routing")
SCRAPE_TIMEOUT_S = 2.0  # the default of FABRIC_SCRAPE_TIMEOUT_SECS
SCRAPE_CONCURRENCY = 64
YIELD_EVERY = 500  # replicas a pass judges between two yields to the event loop


@dataclass
class RoutingMemory:
    plans: dict[str, RoutingPlan] = field(default_factory=dict)
    published: dict[str, PublishedPlan] = field(default_factory=dict)  # endpoint -> its plan record, read each tick
    weights: dict[str, tuple] = field(default_factory=dict)  # endpoint -> weights last recorded as an event
    series: dict[str, set[str]] = field(default_factory=dict)  # endpoint -> replicas with a weight series
    stall_since: dict[str, float] = field(default_factory=dict)  # replica -> running with no token progress since
    stalled: set[str] = field(default_factory=set)  # replicas marked stalled at their last scrape
    drain_pushed: dict[str, float] = field(default_factory=dict)  # deleting endpoint -> its drain first pushed


@dataclass
class Decided:
    """What one routing pass decided to write: new plan generations and weight events, written
    in one batch each (``write``) instead of a store call apiece on the event loop."""

    plans: list[PublishedPlan] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    revision: int | None = None  # the store's revision, read once per pass for new generations

    def generation(self, store: Store, previous: PublishedPlan | None) -> int:
        """A new decision's generation (common.records.plans): above the previous one and above
        every generation written before this pass, since each was at most the revision of its
        pass plus one and writing it moved the revision past that."""
        if self.revision is None:
            self.revision = store.revision()
        return max(previous.generation + 1 if previous is not None else 1, self.revision + 1)

    def write(self, store: Store, events: EventSink) -> None:
        plans.publish_all(store, self.plans)
        events.write_all(self.events)
        self.plans, self.events = [], []


class RoutingWorker:
    def __init__(self, store: Store, agents, pool: vip_pool.AddressPool, *,
                 clock: Callable[[], float] = time.time, metrics=None, rollouts: RolloutWorker | None = None,
                 events: EventSink | None = None, stall_s: float = 60.0, drain_grace_s: float = 30.0,
                 scrape_timeout_s: float = SCRAPE_TIMEOUT_S, push_deadline_s: float = PUSH_DEADLINE_S):
        self.store = store
        self.stall_s = stall_s
        self.drain_grace_s = drain_grace_s
        self.rollouts = rollouts
        self.events = events or EventSink(store)
        self.agents = agents
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.memory = RoutingMemory()
        self._decided = Decided()  # one per pass (tick)
        self.pushes = Pushes(agents, clock, deadline_s=push_deadline_s, metrics=metrics)
        # Engines no agent observes (the lab without agents, dry-run): scraped from here.
        self.observer = EngineObserver(MetricsScraper(timeout_s=scrape_timeout_s, concurrency=SCRAPE_CONCURRENCY),
                                       clock=clock)
        self._parsed = ParseCache()  # store records by (key, mod_revision): unchanged ones are not re-validated
        self._parsed_plans = ParseCache()  # the published plans, likewise (shared: replaced, never changed)
        # The records a pass reads, listed once and then kept by their changes (common.store.mirror):
        # the fleet's keys streamed between passes (fabricd may watch all of them), so a pass asks
        # the store only what the stream has not brought yet, often nothing but its revision.
        self.mirror = Mirror(store, [*ROUTING_PREFIXES, keyspace.routing_plans(), MANAGED_SERVICES, keyspace.vips()],
                             follow=[keyspace.ROOT + "/"])
        self._managed: dict[str, str] = {}  # managed-service key -> value: the mirror's, with this pass's writes
        self._held = vip_pool.Held({})  # the VIPs as this pass began, with its claims and releases
        self._unwritten: list[ReplicaObservation] = []  # this tick's observations the store needs

    async def aclose(self) -> None:
        await self.observer.aclose()
        self.mirror.close()

    # -- scraping ---------------------------------------------------------------------------------

    async def scrape_all(self, snap: Snapshot) -> None:
        """This pass's observation of every eligible replica in ``snap.observations``: the stored
        one where the node's agent reports them, a scrape from here otherwise;
        ``write_observations`` later stores those that changed materially."""
        # Draining replicas too: their running count says when the drain may end (the plan
        # gives them no weight whatever they report).
        ready = [r for r in snap.all_replicas() if r.ready and r.host and r.phase != "Deleting"]
        by_id = {r.replica_id: r for r in ready}
        by_agent = snap.agent_observed(ready)
        reported = [r for r in ready if r.replica_id in by_agent]
        scraped = [EngineTarget(r.replica_id, r.host or "", r.port, r.runtime, r.deployment)
                   for r in ready if r.replica_id not in by_agent]
        fresh = await self.observer.observe_all(scraped)
        if self.metrics:
            self.metrics.scrape_failures.inc(sum(1 for o in fresh if not o.ok))
        for i, obs in enumerate([*fresh, *(o for r in reported if (o := snap.observations.get(r.replica_id)) is not None)]):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # 8,000 replicas' stall marks: the loop's other tasks run between
            stored = snap.observations.get(obs.replica_id)
            obs = self._stall(by_id[obs.replica_id], obs)
            snap.observations[obs.replica_id] = obs
            if material_change(stored, obs):
                self._unwritten.append(obs)
        live = {r.replica_id for r in snap.all_replicas()}
        self.observer.keep_only(live, {t.metrics_origin for t in scraped})
        for rid in [rid for rid in self.memory.stall_since if rid not in live]:
            del self.memory.stall_since[rid]
        self.memory.stalled &= live

    def _stall(self, r: Replica, obs: ReplicaObservation) -> ReplicaObservation:
        """Mark a replica running requests without token progress for stall_s (routing.stall);
        one event when it stalls and one when it moves again."""
        was = self.memory.stall_since.get(r.replica_id)
        since = stall_since(was, obs)
        if since is None:
            self.memory.stall_since.pop(r.replica_id, None)
        else:
            self.memory.stall_since[r.replica_id] = since
        marked = mark(obs, since, self.stall_s)
        before = r.replica_id in self.memory.stalled
        if marked.stalled:
            self.memory.stalled.add(r.replica_id)
        else:
            self.memory.stalled.discard(r.replica_id)
        if marked.stalled and not before and since is not None:
            self.events("replica", r.replica_id, "ReplicaStalled", f"{r.deployment}: {obs.running:g} requests running "
                        f"and no generated tokens for {obs.scraped_at - since:.0f}s; weight 0 until it moves",
                        warning=True)
        elif before and not marked.stalled:
            self.events("replica", r.replica_id, "ReplicaUnstalled", f"{r.deployment}: tokens advance again")
        return marked

    async def write_observations(self) -> None:
        """This pass's materially changed observations in one batch (Store.put_all: one
        transaction, one etcd txn per 128), in a worker thread: never one synchronous write per
        replica on the event loop. Fenced like every write: a lost lease writes none of them."""
        batch, self._unwritten = self._unwritten, []
        if batch:
            await asyncio.to_thread(observations.put_all, self.store, batch)

    def forget_pushes(self) -> None:
        """Trust no acknowledgement (another leader ran): the next tick compares every agent's
        reported generations with the published plans and sends what differs."""
        self.pushes.forget()

    # -- endpoints ---------------------------------------------------------------------------------

    def _read(self) -> tuple[Snapshot, dict[str, PublishedPlan]]:
        """The changes since the last pass into the mirror, and the snapshot and published plans
        parsed from it (unchanged records not validated again): in a worker thread, so the event
        loop runs its other tasks (the lease, the API) between the interpreter's switches instead
        of waiting out 8,000 observations' parse (bench-scale). Only the tick reads or writes the
        mirror and the parse caches."""
        self.mirror.apply(self.mirror.fetch())
        snap = load_routing_snapshot(self.mirror, cache=self._parsed)  # type: ignore[arg-type]  # the read verbs
        kvs = self.mirror.list(keyspace.routing_plans())
        published = {p.endpoint: p for p in self._parsed_plans.parse_all(kvs, PublishedPlan)}
        self._parsed_plans.forget_except({kv.key for kv in kvs})
        return snap, published

    async def tick(self) -> None:
        snap, self.memory.published = await asyncio.to_thread(self._read)
        self._unwritten.clear()
        await self.scrape_all(snap)  # snap.observations now holds this tick's scrapes
        if self.rollouts is not None:  # judged on this tick's counters; shares pushed below
            self.rollouts.advance(snap.replicas, snap.observations)
        self._managed = {kv.key: kv.value for kv in self.mirror.list(MANAGED_SERVICES)}
        self._held = vip_pool.Held(vip_pool.allocations(self.mirror))  # type: ignore[arg-type]
        self._decided = Decided()
        services: dict[str, MaglevServicePut] = {}  # this pass's services, by VIP:PORT/PROTO
        routed: list[tuple[InferenceEndpoint, RoutingPlan, PublishedPlan]] = []
        for name in sorted(snap.endpoints):
            ep = snap.endpoints[name]
            deleting = ep.status.phase == "Deleting"
            try:
                if deleting:
                    await self.drain_endpoint(snap, ep, services)
                    continue
                got = self.apply_endpoint(snap, ep, services)
            except FabricError as exc:
                self._set_status(ep, phase="Deleting" if deleting else "Pending", message=exc.message)
                continue
            if got is not None:
                routed.append(got)
            # an endpoint's own writes (a new VIP, a status) are the loop's; yielding after each
            # keeps a pass that writes many (the first, 500 endpoints) from holding the event loop
            # longer than one endpoint's
            await asyncio.sleep(0)
        # the plans and weight events decided above, in one batch each, off the loop, before the
        # push: an agent never holds a generation the store does not
        await asyncio.to_thread(self._decided.write, self.store, self.events)
        now = self.clock()
        self.pushes.keep_only(snap.nodes)
        await self.pushes.push([n for n in snap.nodes.values() if node_online(n, now, SchedulerSettings())],
                               services)  # weights reach the agents before the store writes
        for ep, plan, published in routed:
            self._report(ep, plan, published)
            await asyncio.sleep(0)  # a status write each, at most: as above
        await self.write_observations()
        HISTORY.observe_routing(snap, self.memory.plans)  # the console's charts (controlplane.history)
        await self.release_orphans(snap)

    def apply_endpoint(self, snap: Snapshot, ep: InferenceEndpoint, services: dict[str, MaglevServicePut]
                       ) -> tuple[InferenceEndpoint, RoutingPlan, PublishedPlan] | None:
        """Take the VIP, decide and publish the plan, queue its service for the push."""
        try:
            vip = vip_pool.allocate(self.store, ep.name, self.pool, held=self._held)
        except Conflict as exc:
            self._set_status(ep, phase="Pending", message=exc.message)
            return None
        if ep.status.vip != vip:
            self.events("endpoint", ep.name, "VipTaken", f"VIP {vip}:{ep.port} from the address pool",
                        tenant=ep.tenant)
        replicas, now = snap.replicas.get(ep.deployment, []), self.clock()
        rollout = self.rollouts.active.get(ep.deployment) if self.rollouts is not None else None
        plan, split = endpoint_plan(ep, replicas, snap.observations, snap.nodes, now, rollout=rollout,
                                    sites=snap.sites, vip=vip)
        self.memory.plans[ep.name] = plan
        self._record_weights(ep, plan)
        published = self._publish(ep, plan, split, vip, spill_pools(ep, snap.replicas, snap.observations, snap.nodes, now, snap.sites), now,
                                  self._decided)
        self._queue(published, services)
        return ep, plan, published

    def _publish(self, ep: InferenceEndpoint, plan: RoutingPlan, split, vip: str | None, spill: list[SpillPool],
                 now: float, batch: Decided | None = None) -> PublishedPlan:
        """The endpoint's published plan: the stored one while the decision is the same, else a
        new generation, added to ``batch`` (written before the push) or written now."""
        previous = self.memory.published.get(ep.name)
        fresh = to_published(ep, plan, split, vip, spill, now, previous.generation if previous else 1)
        if same_decision(previous, fresh):
            assert previous is not None
            return previous
        fresh = to_published(ep, plan, split, vip, spill, now, self._decided.generation(self.store, previous))
        if batch is not None:
            batch.plans.append(fresh)
        else:  # written now (a draining endpoint's, before its service goes): later generations read anew
            plans.publish(self.store, fresh)
            self._decided.revision = None
        self.memory.published[ep.name] = fresh
        return fresh

    def _queue(self, published: PublishedPlan, services: dict[str, MaglevServicePut]) -> None:
        """Add the plan's service to this pass's push (and record it as Fabric-made)."""
        if published.service is None or published.vip is None:
            return
        key, record = managed_service_key(published.vip, published.port, PROTO), json.dumps(
            {"endpoint": published.endpoint})
        if self._managed.get(key) != record:
            self.store.put(key, record)
            self._managed[key] = record
        put = MaglevServicePut(vip=published.vip, port=published.port, proto=published.proto,
                               **published.service.model_dump())
        services[put.key] = put

    def _report(self, ep: InferenceEndpoint, plan: RoutingPlan, published: PublishedPlan) -> None:
        """The endpoint's status after the push: VIP, replicas routed, agents that lag."""
        vip = published.vip
        included = sum(1 for e in plan.entries if e.included)
        message = f"VIP {vip}:{ep.port} ({ep.forwarding}); {included}/{len(plan.entries)} replicas routed ({ep.routing})"
        if plan.entries and not plan.backends and included:
            message += "; no IP backends for Maglev (dry-run or hostname replicas, or dsr-ipip ones without the VIP), gateway only"
        notes = self.pushes.notes(published.service_key or "") if published.service is not None else []
        if notes:
            message += "; " + "; ".join(notes)
        phase = "Ready" if included else "Pending"
        self._set_status(ep, phase=phase, message=message, vip=vip)
        self._export_weights(ep.name, plan)

    async def drain_endpoint(self, snap: Snapshot, ep: InferenceEndpoint,
                             services: dict[str, MaglevServicePut]) -> None:
        """An endpoint being deleted: its service stays with every backend draining (no new flows,
        the established ones finish) until the engines behind it report nothing running or
        waiting in a scrape after that plan was published, or the drain grace since the deletion
        has passed; then the service goes from every agent, the VIP back to the pool, the plan
        and the record last. Until then its status says Deleting and why."""
        now = self.clock()
        since = ep.status.deleting_since or now
        vip = ep.status.vip
        replicas = [r.model_copy(update={"draining": True}) for r in snap.replicas.get(ep.deployment, [])]
        plan = endpoint_plan(ep, replicas, snap.observations, snap.nodes, now, sites=snap.sites, vip=vip)[0]
        busy = 0
        if vip is not None:
            published = self._publish(ep, plan, None, vip, [], now)
            self._queue(published, services)
            pushed_at = self.memory.drain_pushed.setdefault(ep.name, now)
            live = {e.replica_id for e in plan.entries if e.draining}
            for rid in live:
                o = snap.observations.get(rid)
                if o is None or not o.ok or o.scraped_at <= pushed_at or o.running or o.queue_depth:
                    busy += 1
            if busy and now - since < self.drain_grace_s:
                self._set_status(ep, phase="Deleting", message=f"deleting: VIP {vip} drains the calls in flight on "
                                 f"{busy} replica(s) (until idle or {self.drain_grace_s:g}s after deletion)")
                return
            if published.service_key is not None:
                services.pop(published.service_key, None)
            if not await self.remove_service(snap, vip, ep.port):
                self._set_status(ep, phase="Deleting", message=f"deleting: waiting for every agent to drop VIP {vip}")
                return
            self.store.delete(managed_service_key(vip, ep.port, PROTO))
            self._managed.pop(managed_service_key(vip, ep.port, PROTO), None)
            vip_pool.release(self.store, vip, ep.name, held=self._held)
            self.events("endpoint", ep.name, "VipReleased", f"VIP {vip} back to the pool after the drain "
                        f"({'grace ended' if busy else 'idle'})", tenant=ep.tenant)
        plans.discard(self.store, ep.name)
        self.store.delete(keyspace.endpoints(ep.name))
        self.events("endpoint", ep.name, "Deleted", f"endpoint {ep.name} deleted", tenant=ep.tenant)
        snap.endpoints.pop(ep.name, None)
        self.memory.drain_pushed.pop(ep.name, None)
        self.memory.plans.pop(ep.name, None)
        self.memory.published.pop(ep.name, None)
        self.memory.weights.pop(ep.name, None)

    def _export_weights(self, endpoint: str, plan: RoutingPlan | None) -> None:
        """fabric_routing_weight{endpoint,replica} for the endpoint's current replicas only: the
        series of a replica that is gone (or of a deleted endpoint, plan None) is removed, so
        "all weights zero" keeps reading the live fleet."""
        if not self.metrics:
            return
        now = {e.replica_id: e.weight for e in plan.entries} if plan is not None else {}
        for rid in self.memory.series.get(endpoint, set()) - set(now):
            try:
                self.metrics.weight.remove(endpoint, rid)
            except KeyError:
                pass
        for rid, weight in now.items():
            self.metrics.weight.labels(endpoint, rid).set(weight)
        if now:
            self.memory.series[endpoint] = set(now)
        else:
            self.memory.series.pop(endpoint, None)

    def _record_weights(self, ep: InferenceEndpoint, plan: RoutingPlan) -> None:
        """One event per change of the endpoint's weights (never per tick)."""
        weights = tuple((e.replica_id, e.weight) for e in plan.entries if e.included)
        if self.memory.weights.get(ep.name) == weights:
            return
        self.memory.weights[ep.name] = weights
        text = ", ".join(f"{rid}={w}" for rid, w in weights) or "no replica routed"
        self._decided.events.append(new_event("endpoint", ep.name, "WeightsChanged", f"{plan.strategy}: {text}",
                                              tenant=ep.tenant))

    def _set_status(self, ep: InferenceEndpoint, **status) -> None:
        """Write the endpoint's status unless the snapshot already shows exactly these values."""
        if all(getattr(ep.status, k, None) == v for k, v in status.items()):
            return
        update_endpoint_status(self.store, ep.name, **status)

    async def remove_service(self, snap: Snapshot, vip: str, port: int) -> bool:
        """DELETE the service on every registered agent at once; True when it is absent on all. A
        silent agent (controlplane.routing.push) is not asked, and keeps the service counted."""
        async def remove(node) -> bool:
            if self.pushes.silent(node.id):
                return False
            try:
                await self.agents.for_node(node).delete_service(vip, port, PROTO)  # False on 404
            except Refused:
                pass  # no dataplane on that agent: nothing there to remove
            except FabricError as exc:
                log.warning("cannot remove service %s:%s on %s yet: %s", vip, port, node.id, exc.message)
                return False
            return True

        key = f"{vip}:{port}/{PROTO}"
        results = await asyncio.gather(*(remove(n) for n in snap.nodes.values() if self.pushes.may_hold(n, key)))
        if all(results):
            self.pushes.drop(key)
            return True
        return False

    async def release_orphans(self, snap: Snapshot) -> None:
        """Fabric-made services whose endpoint is gone (or moved port): Maglev first; then the VIPs
        of deleted endpoints, once no service of theirs is left on any agent."""
        still_served: set[str] = set()
        for key, value in list(self._managed.items()):
            vip, port, _ = key[len(MANAGED_SERVICES):].split(":")
            ep = snap.endpoints.get(json.loads(value).get("endpoint", ""))
            if ep is not None and ep.port == int(port) and ep.status.vip in (None, vip):
                continue
            listed = self.mirror.get(key)
            if listed is not None and listed.value == value and await self.remove_service(snap, vip, int(port)):
                self.store.delete(key, mod_revision=listed.mod_revision)
                del self._managed[key]
            else:  # still on an agent, or written by this pass (the next one sees its revision)
                still_served.add(vip)
        for vip, owner in list(self._held.owners.items()):
            if owner in snap.endpoints or vip in still_served:
                continue
            if vip_pool.release(self.store, vip, owner, held=self._held):
                log.info("released VIP %s of deleted endpoint %s", vip, owner)
                self.events("endpoint", owner, "VipReleased", f"VIP {vip} back to the pool; the endpoint is gone")
                self.memory.weights.pop(owner, None)
            self.memory.plans.pop(owner, None)
        for gone in [name for name in self.memory.series if name not in snap.endpoints]:
            self._export_weights(gone, None)
        for gone in [name for name in self.memory.published if name not in snap.endpoints]:
            plans.discard(self.store, gone)  # the endpoint's record went another way (a restore, a hand edit)
            del self.memory.published[gone]
