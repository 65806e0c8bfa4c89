"""Applies routing plans: scrapes engines, records observations, owns endpoint VIPs and Maglev.

One tick:
  1. scrape every Ready replica's /metrics concurrently (timeout each); write a
     ReplicaObservation per replica (a failed scrape is written as ok=False, never as zeros);
  2. for every endpoint: take its VIP (vip_pool.allocate, create-if-absent), compute the routing
     plan, and PUT the service on every online agent when the backends or weights changed since
     the last push (an agent without a dataplane answers 400 and is skipped);
  3. for every VIP whose endpoint is gone: DELETE the service on every registered agent (404
     counts as absent); only when all agents answered is the VIP released. An unreachable agent
     keeps the VIP, retried next tick.
Previous samples live in memory only to compute rates; a restart loses one scrape window.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from common import keyspace
from common.agent_api import MaglevServiceSpec
from common.errors import Conflict, FabricError, Refused
from common.schemas import InferenceEndpoint, Replica, ReplicaObservation
from common.store.base import Store
from controlplane import vip_pool
from controlplane.orchestration_state import (
    MANAGED_SERVICES,
    Snapshot,
    load_snapshot,
    managed_service_key,
    update_endpoint_status,
)
from controlplane.routing.metrics_parse import (
    EngineSample,
    MetricsParseError,
    failed_observation,
    observe,
    parse_vllm_metrics,
)
from controlplane.routing.strategies import RoutingPlan, plan_routing
from controlplane.scheduler import SchedulerSettings, node_online

log = logging.getLogger("fabricd.routing")
SCRAPE_TIMEOUT_S = 2.0
PROTO = "tcp"


@dataclass
class RoutingMemory:
    samples: dict[str, tuple[EngineSample, float]] = field(default_factory=dict)
    pushed: dict[tuple[str, str], tuple] = field(default_factory=dict)  # (endpoint, node) -> backends
    plans: dict[str, RoutingPlan] = field(default_factory=dict)


class RoutingWorker:
    def __init__(self, store: Store, agents, pool: vip_pool.AddressPool, *,
                 clock: Callable[[], float] = time.time, metrics=None):
        self.store = store
        self.agents = agents
        self.pool = pool
        self.clock = clock
        self.metrics = metrics
        self.memory = RoutingMemory()
        self._http = httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S)

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- scraping ---------------------------------------------------------------------------------

    async def _scrape(self, r: Replica) -> ReplicaObservation:
        now = self.clock()
        try:
            resp = await self._http.get(f"http://{r.host}:{r.port}/metrics")
            if resp.status_code != 200:
                raise MetricsParseError(f"HTTP {resp.status_code}")
            sample = parse_vllm_metrics(resp.text)
        except (httpx.HTTPError, MetricsParseError) as exc:
            obs = failed_observation(r.replica_id, f"{type(exc).__name__}: {exc}"[:200], now)
            if self.metrics:
                self.metrics.scrape_failures.inc()
        else:
            prev = self.memory.samples.get(r.replica_id)
            obs = observe(r.replica_id, sample, prev[0] if prev else None, now - prev[1] if prev else 0.0, now)
            self.memory.samples[r.replica_id] = (sample, now)
        return obs

    async def scrape_all(self, snap: Snapshot) -> None:
        ready = [r for r in snap.all_replicas() if r.ready and r.host and not r.draining]
        # Scrape concurrently, write one by one: a fenced write that fails (lease lost) then
        # stops the pass instead of leaving sibling scrapes writing in the background.
        for obs in await asyncio.gather(*(self._scrape(r) for r in ready)):
            self.store.put(keyspace.observations(obs.replica_id), obs.model_dump_json())
        live = {r.replica_id for r in snap.all_replicas()}
        for rid in [rid for rid in self.memory.samples if rid not in live]:
            del self.memory.samples[rid]

    def forget_pushes(self) -> None:
        """Push every service again on the next tick (e.g. after another leader ran)."""
        self.memory.pushed.clear()

    # -- endpoints ---------------------------------------------------------------------------------

    async def tick(self) -> None:
        snap = load_snapshot(self.store)
        await self.scrape_all(snap)
        snap = load_snapshot(self.store)  # with the observations just written
        for name in sorted(snap.endpoints):
            try:
                await self.apply_endpoint(snap, snap.endpoints[name])
            except FabricError as exc:
                update_endpoint_status(self.store, name, phase="Pending", message=exc.message)
        await self.release_orphans(snap)

    def plan(self, snap: Snapshot, ep: InferenceEndpoint) -> RoutingPlan:
        return plan_routing(ep, snap.replicas.get(ep.deployment, []), snap.observations, snap.nodes, self.clock())

    async def apply_endpoint(self, snap: Snapshot, ep: InferenceEndpoint) -> None:
        try:
            vip = vip_pool.allocate(self.store, ep.name, self.pool)
        except Conflict as exc:
            update_endpoint_status(self.store, ep.name, phase="Pending", message=exc.message)
            return
        plan = self.plan(snap, ep)
        self.memory.plans[ep.name] = plan
        backends = plan.backends
        notes: list[str] = []
        if backends:
            self.store.put(managed_service_key(vip, ep.port, PROTO), json.dumps({"endpoint": ep.name}))
            spec = MaglevServiceSpec(backends={f"{h}:{p}": w for h, p, w in backends})
            for node in snap.nodes.values():
                if not node_online(node, self.clock(), SchedulerSettings()):
                    continue
                if self.memory.pushed.get((ep.name, node.id)) == backends:
                    continue  # only push when weights change
                try:
                    await self.agents.for_node(node).put_service(vip, ep.port, PROTO, spec)
                except Refused:
                    self.memory.pushed[(ep.name, node.id)] = backends  # no dataplane there
                    continue
                except FabricError as exc:
                    notes.append(f"Maglev push to {node.id} failed: {exc.message}")
                    continue
                self.memory.pushed[(ep.name, node.id)] = backends
                if self.metrics:
                    self.metrics.maglev_pushes.inc()
        included = sum(1 for e in plan.entries if e.included)
        message = f"VIP {vip}:{ep.port}; {included}/{len(plan.entries)} replicas routed ({ep.routing})"
        if plan.entries and not backends and included:
            message += "; no IP backends for Maglev (dry-run or hostname replicas), gateway only"
        if notes:
            message += "; " + "; ".join(notes)
        phase = "Ready" if included else "Pending"
        update_endpoint_status(self.store, ep.name, phase=phase, message=message, vip=vip)
        if self.metrics:
            for e in plan.entries:
                self.metrics.weight.labels(ep.name, e.replica_id).set(e.weight)

    async def remove_service(self, snap: Snapshot, vip: str, port: int) -> bool:
        """DELETE the service on every registered agent; True when it is absent on all."""
        absent = True
        for node in snap.nodes.values():
            try:
                await self.agents.for_node(node).delete_service(vip, port, PROTO)  # False on 404
            except Refused:
                pass  # no dataplane on that agent: nothing there to remove
            except FabricError as exc:
                log.warning("cannot remove service %s:%s on %s yet: %s", vip, port, node.id, exc.message)
                absent = False
        return absent

    async def release_orphans(self, snap: Snapshot) -> None:
        """Fabric-made services whose endpoint is gone (or moved port): Maglev first; then the VIPs
        of deleted endpoints, once no service of theirs is left on any agent."""
        still_served: set[str] = set()
        for kv in self.store.list(MANAGED_SERVICES):
            vip, port, _ = kv.key[len(MANAGED_SERVICES):].split(":")
            ep = snap.endpoints.get(json.loads(kv.value).get("endpoint", ""))
            if ep is not None and ep.port == int(port) and ep.status.vip in (None, vip):
                continue
            if await self.remove_service(snap, vip, int(port)):
                self.store.delete(kv.key, mod_revision=kv.mod_revision)
            else:
                still_served.add(vip)
        for vip, owner in vip_pool.allocations(self.store).items():
            if owner in snap.endpoints or vip in still_served:
                continue
            if vip_pool.release(self.store, vip, owner):
                log.info("released VIP %s of deleted endpoint %s", vip, owner)
            for key in [k for k in self.memory.pushed if k[0] == owner]:
                del self.memory.pushed[key]
            self.memory.plans.pop(owner, None)
