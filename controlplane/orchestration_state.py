"""Typed reads of everything orchestration decides on, and the records of what Fabric created.

``load_snapshot(store)`` reads nodes, models, profiles, deployments, endpoints, replicas,
observations and GPU reservations once, so a tick (or an explain request) plans from one
consistent-enough picture. Records load as they were stored (a profile whose runtime was
denied later still loads); records that fail validation are skipped and counted rather than
crashing a loop (the door's parse policy, common.records.reading). ``load_routing_snapshot(store, cache=...)`` reads only what
the routing job plans from (nodes, endpoints, sites, replicas, observations: one list per prefix,
ROUTING_PREFIXES; the routing leader reads them from a Mirror, so the store is asked only for
changes), and with a ParseCache it re-validates only records whose mod_revision changed since
the last call.

Fabric records what it created before creating it, so the sweep removes only its own leftovers
and never a VM or service someone else made on the agent: VMs in common.records.managed, Maglev
services per VIP:port:proto under MANAGED_SERVICES (the routing controller's, until it reads and
writes them through common.records too).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel

from common import keyspace
from common.engine_metrics.reported import agent_observed, observed_by_node
from common.errors import NotFound
from common.mig_catalog import MigSlice
from common.records import deployments, endpoints, plans, reading, replicas
from common.records.cas import Contended
from common.records.resource import Records
from common.rollouts import Revision, Rollout
from common.schemas import (
    InferenceDeployment,
    InferenceEndpoint,
    InferenceProfile,
    ModelArtifact,
    Node,
    Replica,
    ReplicaObservation,
    Site,
    TenantQuota,
)
from common.store.base import KV, Store
from common.tenant_policies import TenantPolicy
from controlplane.mig.inventory import nodes_with_slices
from controlplane.placement.index import PlacementIndex
from controlplane.placement.scheduler import (
    NOTHING_COMMITTED,
    Committed,
    SchedulerSettings,
    committed_resources,
)

MANAGED_SERVICES = f"{keyspace.ROOT}/managed/services/"


def managed_service_key(vip: str, port: int, proto: str = "tcp") -> str:
    return f"{MANAGED_SERVICES}{vip}:{port}:{proto}"


@dataclass(frozen=True)
class Reservation:
    node: str
    pci: str
    replica_id: str
    deployment: str
    mod_revision: int


@dataclass
class Capacity:
    """What every node holds in one pass, computed once (``Snapshot.capacity``): the GPUs reserved
    and the CPU and memory committed per node, and the free-capacity index the pass's plans place
    with (built at the first placement; a plan reserves what it places in it). ``Snapshot.hold``
    keeps the first two current, so a deployment planned later in the pass sees the replicas
    planned before it without a recomputation over every replica."""

    reserved: dict[str, set[str]]
    committed: dict[str, Committed]
    index: PlacementIndex | None = None

    def placement(self, nodes: list[Node], now: float, settings: SchedulerSettings,
                  sites: dict[str, Site]) -> PlacementIndex:
        if self.index is None:
            self.index = PlacementIndex(nodes, self.reserved, now, settings, committed=self.committed, sites=sites)
        return self.index


@dataclass
class Snapshot:
    nodes: dict[str, Node] = field(default_factory=dict)
    models: dict[str, ModelArtifact] = field(default_factory=dict)
    profiles: dict[str, InferenceProfile] = field(default_factory=dict)
    deployments: dict[str, InferenceDeployment] = field(default_factory=dict)
    deployment_revisions: dict[str, int] = field(default_factory=dict)
    endpoints: dict[str, InferenceEndpoint] = field(default_factory=dict)
    replicas: dict[str, list[Replica]] = field(default_factory=dict)  # by deployment
    observations: dict[str, ReplicaObservation] = field(default_factory=dict)
    reservations: list[Reservation] = field(default_factory=list)
    revisions: dict[str, dict[int, Revision]] = field(default_factory=dict)  # by deployment, number
    rollouts: dict[str, Rollout] = field(default_factory=dict)  # the active one per deployment
    sites: dict[str, Site] = field(default_factory=dict)  # site records by name (residency, failover, cost)
    guaranteed_gpus: dict[str, int] = field(default_factory=dict)  # tenant -> its quota's guaranteed_gpus
    # tenants whose policy lets their replicas preempt other tenants' (an admin's choice)
    preempt_other_tenants: set[str] = field(default_factory=set)
    _capacity: Capacity | None = field(default=None, repr=False, compare=False)  # capacity(): once per pass
    _observed: dict[str, set[str]] | None = field(default=None, repr=False, compare=False)  # agent_observed()

    def agent_observed(self, replicas: Iterable[Replica]) -> set[str]:
        """common.engine_metrics.reported.agent_observed, the nodes' lists indexed once per pass
        (a pass asks once per deployment)."""
        if self._observed is None:
            self._observed = observed_by_node(self.nodes)
        return agent_observed(self._observed, replicas)

    def template(self, dep: InferenceDeployment, revision: int):
        """(profile, model, engine_args) replicas of ``revision`` run: the deployment's own for its
        current revision (or an unknown one), else the stored revision's template."""
        rev = self.revisions.get(dep.name, {}).get(revision)
        if revision == dep.revision or rev is None:
            return self.profiles.get(dep.profile), self.models.get(dep.model), list(dep.engine_args)
        t = rev.template
        return self.profiles.get(t.profile), self.models.get(t.model), list(t.engine_args)

    def reserved_by_node(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for r in self.reservations:
            out.setdefault(r.node, set()).add(r.pci)
        return out

    def capacity(self) -> Capacity:
        """Reserved GPUs and committed CPU and memory per node: computed at the first call, then
        kept current by ``hold`` (a replica entered any other way is not counted)."""
        if self._capacity is None:
            self._capacity = Capacity(self.reserved_by_node(), self.committed())
        return self._capacity

    def hold(self, replica: Replica) -> None:
        """Enter a replica a plan will create: into the replicas, its GPUs into the reservations,
        and both into the capacity once computed (its own revision's profile committed)."""
        self.replicas.setdefault(replica.deployment, []).append(replica)
        self.reservations.extend(Reservation(replica.node, pci, replica.replica_id, replica.deployment, 0)
                                 for pci in replica.gpus)
        cap = self._capacity
        if cap is None or not replica.node:
            return
        cap.reserved.setdefault(replica.node, set()).update(replica.gpus)
        dep = self.deployments.get(replica.deployment)
        profile = None if dep is None else self.template(dep, replica.revision)[0]
        if profile is not None:
            cap.committed[replica.node] = cap.committed.get(replica.node, NOTHING_COMMITTED).plus(profile)

    def all_replicas(self) -> list[Replica]:
        return [r for reps in self.replicas.values() for r in reps]

    def committed(self) -> dict[str, Committed]:
        """node id -> CPU and memory its replicas (every deployment, every phase) hold."""
        def profile_of(r: Replica):  # a replica holds what its own revision's profile asks for
            dep = self.deployments.get(r.deployment)
            return None if dep is None else self.template(dep, r.revision)[0]

        return committed_resources(self.all_replicas(), self.deployments, self.profiles, profile_of)


def json_field(kv: KV | None, name: str) -> str | None:
    """One field of a small JSON record (a VIP's or a GPU reservation's owner); None when the
    key is absent or the value is not a JSON object."""
    if kv is None:
        return None
    try:
        return json.loads(kv.value).get(name)
    except (ValueError, AttributeError):
        return None


_KINDS: dict[type[BaseModel], str] = {
    Node: "node", ModelArtifact: "model", InferenceProfile: "profile", InferenceDeployment: "deployment",
    InferenceEndpoint: "endpoint", Site: "site", TenantQuota: "quota", TenantPolicy: "policy", Replica: "replica",
    ReplicaObservation: "observation", Revision: "revision", Rollout: "rollout", MigSlice: "MIG slice",
    plans.PublishedPlan: plans.KIND}


def _parse(kv: KV, model: type[BaseModel]):
    """The record, or None (skipped and counted) when it does not parse. "Stored": a record loads
    as it was accepted (a profile whose runtime is denied since still loads; the reconciler says
    why its deployment cannot run)."""
    found = reading.pairs(model, [kv], _KINDS.get(model, model.__name__))
    return found[0][1] if found else None


class ParseCache:
    """Validated records by key and mod_revision, for a loop that reads the same prefixes every
    tick: an unchanged record is not validated again. The objects are shared between snapshots,
    so whoever loads with a cache must treat them as read-only (model_copy to change one)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, object]] = {}

    def parse_all(self, kvs: list[KV], model: type[BaseModel]) -> list:
        out = []
        for kv in kvs:
            hit = self._seen.get(kv.key)
            if hit is not None and hit[0] == kv.mod_revision:
                obj = hit[1]
            else:
                obj = _parse(kv, model)
                self._seen[kv.key] = (kv.mod_revision, obj)
            if obj is not None:
                out.append(obj)
        return out

    def forget_except(self, keys: set[str]) -> None:
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]


def _named(store: Store, prefix: str, model: type[BaseModel]) -> dict:
    out = {}
    for kv in store.list(prefix):
        obj = _parse(kv, model)
        if obj is not None:
            out[obj.name] = obj
    return out


def load_deployment(store: Store, name: str) -> tuple[InferenceDeployment | None, int]:
    kv = store.get(keyspace.deployments(name))
    if kv is None:
        return None, 0
    return reading.one(InferenceDeployment, kv, "deployment"), kv.mod_revision


def load_snapshot(store: Store, cache: ParseCache | None = None) -> Snapshot:
    """Everything the loops plan from. ``cache`` (a loop's own, kept across its passes): replicas
    and observations unchanged since the last pass are not validated again (the bulk of a
    pass's parsing at a thousand nodes); its objects are then shared, read-only."""
    snap = Snapshot()
    for kv in store.list(keyspace.nodes()):
        node = _parse(kv, Node)
        if node is not None:
            snap.nodes[node.id] = node
    snap.models = _named(store, keyspace.models(), ModelArtifact)
    snap.profiles = _named(store, keyspace.profiles(), InferenceProfile)
    for kv in store.list(keyspace.deployments()):
        dep = _parse(kv, InferenceDeployment)
        if dep is not None:
            snap.deployments[dep.name] = dep
            snap.deployment_revisions[dep.name] = kv.mod_revision
    snap.endpoints = _named(store, keyspace.endpoints(), InferenceEndpoint)
    snap.sites = _named(store, keyspace.sites(), Site)
    for kv in store.list(keyspace.quotas()):
        quota = _parse(kv, TenantQuota)
        if quota is not None and quota.guaranteed_gpus:
            snap.guaranteed_gpus[quota.tenant] = quota.guaranteed_gpus
    for kv in store.list(keyspace.policies()):
        policy = _parse(kv, TenantPolicy)
        if policy is not None and policy.preempt_other_tenants:
            snap.preempt_other_tenants.add(policy.tenant)
    parsing = cache if cache is not None else ParseCache()
    listed = store.list(keyspace.replicas())
    for rep in parsing.parse_all(listed, Replica):
        snap.replicas.setdefault(rep.deployment, []).append(rep)
    observed = store.list(keyspace.observations())
    snap.observations = {o.replica_id: o for o in parsing.parse_all(observed, ReplicaObservation)}
    parsing.forget_except({kv.key for kv in listed} | {kv.key for kv in observed})
    for kv in store.list(keyspace.revisions()):
        rev = _parse(kv, Revision)
        if rev is not None:
            snap.revisions.setdefault(rev.deployment, {})[rev.revision] = rev
    for kv in store.list(keyspace.rollouts()):
        rec = _parse(kv, Rollout)
        newest = snap.rollouts.get(rec.deployment) if rec is not None else None
        if rec is not None and (newest is None or rec.id > newest.id):
            snap.rollouts[rec.deployment] = rec
    snap.rollouts = {d: r for d, r in snap.rollouts.items() if r.active}
    # MIG slices are schedulable GPUs of their node; their parents are not (controlplane.mig).
    slices = [s for s in (_parse(kv, MigSlice) for kv in store.list(keyspace.mig_slices())) if s is not None]
    snap.nodes = nodes_with_slices(snap.nodes, slices)
    prefix = keyspace.gpu_reservations()
    for kv in store.list(prefix):
        node, _, pci = kv.key[len(prefix):].partition("/")
        try:
            value = json.loads(kv.value)
        except ValueError:
            value = {}
        snap.reservations.append(
            Reservation(node, pci, value.get("replica_id", ""), value.get("deployment", ""), kv.mod_revision)
        )
    return snap


# What load_routing_snapshot reads (the routing leader mirrors these: common.store.mirror).
ROUTING_PREFIXES = (keyspace.nodes(), keyspace.endpoints(), keyspace.sites(), keyspace.replicas(),
                    keyspace.observations())


def load_routing_snapshot(store: Store, cache: ParseCache | None = None) -> Snapshot:
    """Nodes, endpoints, sites, replicas and observations only (what routing plans from: the
    ROUTING_PREFIXES); ``store`` may be a Mirror of them."""
    cache = ParseCache() if cache is None else cache
    snap = Snapshot()
    listed: set[str] = set()

    def parse(prefix: str, model: type[BaseModel]) -> list:
        kvs = store.list(prefix)
        listed.update(kv.key for kv in kvs)
        return cache.parse_all(kvs, model)

    snap.nodes = {n.id: n for n in parse(keyspace.nodes(), Node)}
    snap.endpoints = {e.name: e for e in parse(keyspace.endpoints(), InferenceEndpoint)}
    snap.sites = {s.name: s for s in parse(keyspace.sites(), Site)}
    for rep in parse(keyspace.replicas(), Replica):
        snap.replicas.setdefault(rep.deployment, []).append(rep)
    snap.observations = {o.replica_id: o for o in parse(keyspace.observations(), ReplicaObservation)}
    cache.forget_except(listed)
    return snap


# The replica write half lives in common.records.replicas; the loops call it by these names.
put_replica, delete_replica, get_replica = replicas.put, replicas.delete, replicas.get


def _update_status(records: Records, store: Store, name: str, status: dict) -> bool:
    """Compare-and-swap the status fields onto the stored record (the API writes the spec); False
    when the record is gone or kept changing."""
    try:
        records.update_status(store, name, **status)
    except (NotFound, Contended):
        return False
    return True


def update_deployment_status(store: Store, name: str, **status) -> bool:
    return _update_status(deployments.RECORDS, store, name, status)


def update_endpoint_status(store: Store, name: str, **status) -> bool:
    return _update_status(endpoints.RECORDS, store, name, status)
