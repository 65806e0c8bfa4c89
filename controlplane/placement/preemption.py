"""Who makes room when a replica of a higher capacity class cannot be placed. Pure.

Capacity classes, lowest first: opportunistic, standard, critical (common.schemas.CAPACITY_CLASSES).
``plan_preemption`` is asked for one new replica of a deployment and answers one of:
  - fits:      the replica fits without taking anything (no victims; the normal placement);
  - waiting:   replicas already draining (preempted earlier, or scaled in) free enough on a node
               once they are gone: nothing more is taken, the replica waits for them;
  - preempt:   the victims to drain, all on one node, and the node and GPUs the replica then takes;
  - nothing:   no preemption makes room (the message says why), so nothing is taken.
Rules:
  - only replicas of strictly lower classes are victims (critical replicas are never taken, and
    opportunistic ones never take any);
  - a tenant's replica takes only replicas of its own tenant, unless an admin set its policy's
    ``preempt_other_tenants`` (``Holders.cross_tenant``); a deployment without a tenant (made by
    an admin or a cluster-wide operator, who act for every tenant) may take any;
  - a deployment never loses replicas below its own floor: ``autoscaling.min_replicas`` when it
    autoscales, else 0; a tenant never loses GPUs below its guaranteed share (its quota's
    ``guaranteed_gpus``, counted over its replicas not draining), whatever their classes;
  - the fewest victims first, then the lowest classes (the highest class in a set decides), then
    the youngest (newest ``created_at``), then replica id: one victim key per replica,
    ``(class rank, -created_at, replica_id)``, and a set compares by (size, its keys worst first);
  - only when it makes room: the node is judged by ``scheduler.judge_node`` with the victims' GPUs,
    CPU and memory given back (draining replicas on it given back too), so site rules, MIG slices,
    IOMMU groups and every other filter hold as for any placement;
  - nodes are judged through the placement index: one-victim plans walk the victims in key order
    and stop at the first that makes room; larger sets are searched per node (at most
    ``MAX_SET`` victims a plan), skipping nodes whose best possible set is already beaten.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common.schemas import CAPACITY_CLASSES, InferenceDeployment, InferenceProfile, ModelArtifact, Replica
from controlplane.placement.index import PlacementIndex
from controlplane.placement.scheduler import NOTHING_COMMITTED, Committed, NodeVerdict, judge_node

MAX_SET = 8  # victims one plan may take (a node holds at most 8-16 GPUs)


def class_rank(capacity_class: str) -> int:
    return CAPACITY_CLASSES.index(capacity_class) if capacity_class in CAPACITY_CLASSES else 1


@dataclass(frozen=True)
class Holder:
    """A replica that holds capacity on a node (a possible victim, or room already on its way)."""

    replica_id: str
    deployment: str
    capacity_class: str
    node: str
    gpus: tuple[str, ...]
    cpu: int
    memory_gib: float
    created_at: float
    draining: bool = False
    tenant: str | None = None

    @property
    def key(self) -> tuple:
        """Smaller is taken first: the lowest class, then the youngest, then the id."""
        return (class_rank(self.capacity_class), -self.created_at, self.replica_id)


@dataclass(frozen=True)
class Preemption:
    deployment: str
    outcome: str  # fits | waiting | preempt | nothing
    node: str | None
    gpus: tuple[str, ...]
    victims: tuple[Holder, ...] = ()
    waiting_on: tuple[str, ...] = ()
    message: str = ""

    def as_dict(self, viewer: str | None = None) -> dict:
        """The plan as explain shows it. ``viewer``: a tenant-bound caller's tenant, who sees its own
        victims by name and other tenants' only as a count (and a message naming none), and the
        replicas it waits for only as a count."""
        shown = [v for v in self.victims if viewer is None or v.tenant == viewer]
        hidden = len(self.victims) - len(shown)
        message = self.message
        if viewer is not None and self.outcome == "waiting":
            message = f"waiting for {len(self.waiting_on)} replicas to drain on {self.node}"
        elif hidden:
            message = f"preempting {len(self.victims)} replicas on {self.node} makes room ({hidden} of other tenants)"
        return {"outcome": self.outcome, "node": self.node, "gpus": list(self.gpus), "message": message,
                "waiting_on": [] if viewer is not None else list(self.waiting_on),  # ids may be others'
                "waiting_on_count": len(self.waiting_on), "other_tenants_victims": hidden,
                "victims": [{"replica_id": v.replica_id, "deployment": v.deployment,
                             "capacity_class": v.capacity_class, "node": v.node, "gpus": list(v.gpus),
                             "created_at": v.created_at} for v in shown]}


@dataclass
class Holders:
    """Every replica holding capacity, by node and in victim order (build once per pass)."""

    by_node: dict[str, list[Holder]] = field(default_factory=dict)
    ordered: list[Holder] = field(default_factory=list)  # not draining, by Holder.key
    floors: dict[str, int] = field(default_factory=dict)  # deployment -> replicas it keeps at least
    live: dict[str, int] = field(default_factory=dict)  # deployment -> replicas not draining
    draining: dict[str, list[Holder]] = field(default_factory=dict)  # node -> its draining replicas
    guaranteed: dict[str, int] = field(default_factory=dict)  # tenant -> GPUs preemption leaves it
    tenant_gpus: dict[str, int] = field(default_factory=dict)  # tenant -> GPUs of its replicas not draining
    cross_tenant: frozenset[str] = frozenset()  # tenants an admin let preempt other tenants' replicas

    @classmethod
    def build(cls, holders: Iterable[Holder], floors: Mapping[str, int],
              guaranteed: Mapping[str, int] | None = None, cross_tenant: Iterable[str] = ()) -> Holders:
        out = cls(floors=dict(floors), guaranteed={t: g for t, g in (guaranteed or {}).items() if g > 0},
                  cross_tenant=frozenset(cross_tenant))
        for h in holders:
            out.by_node.setdefault(h.node, []).append(h)
            if h.draining:
                out.draining.setdefault(h.node, []).append(h)
            else:
                out.ordered.append(h)
                out.live[h.deployment] = out.live.get(h.deployment, 0) + 1
                if h.tenant is not None:
                    out.tenant_gpus[h.tenant] = out.tenant_gpus.get(h.tenant, 0) + len(h.gpus)
        out.ordered.sort(key=lambda h: h.key)
        return out

    def remove(self, h: Holder) -> None:
        """``h`` is gone (its preemption applied): it is no longer a victim nor room on its way."""
        self.by_node[h.node] = [x for x in self.by_node.get(h.node, []) if x.replica_id != h.replica_id]
        if h.draining:
            self.draining[h.node] = [x for x in self.draining.get(h.node, []) if x.replica_id != h.replica_id]
            return
        self.ordered.remove(h)
        self.live[h.deployment] = self.live.get(h.deployment, 1) - 1
        if h.tenant is not None:
            self.tenant_gpus[h.tenant] = self.tenant_gpus.get(h.tenant, 0) - len(h.gpus)

    def may_take(self, taker: str | None, victim: str | None) -> bool:
        """May a replica of tenant ``taker`` preempt one of tenant ``victim``?"""
        return taker is None or taker == victim or taker in self.cross_tenant

    def spare(self, deployment: str) -> int:
        """How many of the deployment's replicas may still be taken."""
        return max(0, self.live.get(deployment, 0) - self.floors.get(deployment, 0))

    def spare_gpus(self, tenant: str | None) -> int | None:
        """GPUs the tenant may still lose above its guaranteed share (None: no guarantee)."""
        if tenant is None or tenant not in self.guaranteed:
            return None
        return self.tenant_gpus.get(tenant, 0) - self.guaranteed[tenant]


def floor_of(dep: InferenceDeployment) -> int:
    return dep.autoscaling.min_replicas if dep.autoscaling is not None else 0


def holders_from(replicas: Iterable[Replica], deployments: Mapping[str, InferenceDeployment],
                 profile_of: Callable[[Replica], InferenceProfile | None],
                 guaranteed: Mapping[str, int] | None = None, cross_tenant: Iterable[str] = ()) -> Holders:
    """Holders from replica records: every replica with a node and a known profile, in any phase
    but Deleting (a Deleting one is gone from every plan already; its room comes back with it).
    ``guaranteed``: tenant -> its quota's guaranteed_gpus; ``cross_tenant``: the tenants whose
    policy has preempt_other_tenants."""
    out = []
    for r in replicas:
        dep = deployments.get(r.deployment)
        profile = profile_of(r) if dep is not None else None
        if dep is None or profile is None or not r.node or r.phase == "Deleting":
            continue
        out.append(Holder(r.replica_id, r.deployment, dep.capacity_class, r.node, tuple(r.gpus), profile.cpu,
                          profile.memory_gib, r.created_at, r.draining, dep.tenant))
    return Holders.build(out, {name: floor_of(d) for name, d in deployments.items()}, guaranteed, cross_tenant)


def judge_without(index: PlacementIndex, node_id: str, removed: Sequence[Holder], deployment: InferenceDeployment,
                  profile: InferenceProfile, model: ModelArtifact, replicas: Sequence[Replica]) -> NodeVerdict:
    """``judge_node`` on the node as it would be with ``removed`` gone (GPUs, CPU, memory back)."""
    node = index.nodes[node_id]
    freed = {g for h in removed for g in h.gpus}
    held = index.committed.get(node_id, NOTHING_COMMITTED)
    held = Committed(held.cpu - sum(h.cpu for h in removed),
                     round(held.memory_gib - sum(h.memory_gib for h in removed), 6),
                     max(0, held.replicas - len(removed)))
    return judge_node(node, deployment, profile, model, index.reserved.get(node_id, set()) - freed, replicas,
                      index.domains, index.now, index.settings, held, index.sites, index.site_of)


def _room(index: PlacementIndex, node_id: str, removed: Sequence[Holder], profile: InferenceProfile, ok) -> bool:
    """Cheap necessary conditions before a judge: enough GPUs of a usable kind, CPU, memory."""
    node = index.nodes.get(node_id)
    if node is None or node_id not in index._placeable:
        return False
    gpus = index.free_of(node_id, ok)
    for h in removed:
        gpus += sum(1 for g in h.gpus if index._kind_of.get((node_id, g)) in ok
                    and g in index.reserved.get(node_id, ()))
    if gpus < profile.gpu.count:
        return False
    held = index.committed.get(node_id, NOTHING_COMMITTED)
    if node.cpu_free - held.cpu + sum(h.cpu for h in removed) < profile.cpu:
        return False
    return round(node.memory_free_gib - held.memory_gib + sum(h.memory_gib for h in removed), 6) >= profile.memory_gib


def _set_key(victims: Sequence[Holder]) -> tuple:
    return (len(victims), tuple(sorted((v.key for v in victims), reverse=True)))


def plan_preemption(index: PlacementIndex, deployment: InferenceDeployment, profile: InferenceProfile,
                    model: ModelArtifact, holders: Holders, *, replicas: Sequence[Replica] = (),
                    exclude: Iterable[str] = ()) -> Preemption:
    """Where one new replica of ``deployment`` goes and what it takes (see the module docstring).

    ``index`` holds today's reservations and commitments (draining replicas still hold theirs);
    ``replicas`` are the deployment's own live replicas (spread and site rules)."""
    exclude = set(exclude)
    name = deployment.name
    best = index.best(deployment, profile, model, replicas=replicas, exclude=exclude)
    if best is not None:
        return Preemption(name, "fits", best.node, best.gpus, message=f"fits without preemption: {best.node}")
    ok = index.ok_kinds(profile)
    draining = {n: hs for n, hs in holders.draining.items() if hs and n not in exclude}

    # Room already on its way: draining replicas free enough somewhere.
    waits = []
    for node_id, gone in draining.items():
        if _room(index, node_id, gone, profile, ok):
            v = judge_without(index, node_id, gone, deployment, profile, model, replicas)
            if v.eligible:
                waits.append((-v.score, node_id, v, gone))
    if waits:
        _, node_id, v, gone = min(waits, key=lambda w: (w[0], w[1]))
        ids = tuple(sorted(h.replica_id for h in gone))
        return Preemption(name, "waiting", node_id, v.gpus, waiting_on=ids,
                          message=f"waiting for {', '.join(ids)} to drain on {node_id}")

    rank = class_rank(deployment.capacity_class)
    if rank == 0:
        return Preemption(name, "nothing", None, (), message="no node can take a replica and opportunistic "
                          "replicas preempt nothing")

    def takeable(h: Holder) -> bool:
        keeps = holders.spare_gpus(h.tenant)
        return (class_rank(h.capacity_class) < rank and h.node not in exclude and holders.spare(h.deployment) > 0
                and (keeps is None or keeps >= len(h.gpus)) and holders.may_take(deployment.tenant, h.tenant))

    # One victim: the first in victim order that makes room alone.
    for h in holders.ordered:
        if class_rank(h.capacity_class) >= rank:
            break  # ordered by class: no lower-class victims are left
        if not takeable(h):
            continue
        removed = [h, *draining.get(h.node, [])]
        if _room(index, h.node, removed, profile, ok):
            v = judge_without(index, h.node, removed, deployment, profile, model, replicas)
            if v.eligible:
                return _preempt(name, v, (h,))

    # Several victims on one node: the smallest set, compared by key, then node id.
    found: tuple | None = None
    for node_id, hs in holders.by_node.items():
        gone = draining.get(node_id, [])
        pool = sorted((h for h in hs if not h.draining and takeable(h)), key=lambda h: h.key)
        if len(pool) < 2 or not _room(index, node_id, [*pool, *gone], profile, ok):
            continue
        for size in range(2, min(len(pool), MAX_SET) + 1):
            if found is not None and size > found[0][0]:
                break
            lower = _set_key(pool[:size])
            if found is not None and (lower, node_id) >= (found[0], found[1]):
                break
            hit = None
            for combo in itertools.combinations(pool, size):  # pool is in key order: best sets first
                if not _fits_floors(combo, holders) or not _room(index, node_id, [*combo, *gone], profile, ok):
                    continue
                v = judge_without(index, node_id, [*combo, *gone], deployment, profile, model, replicas)
                if v.eligible and (hit is None or _set_key(combo) < hit[0]):
                    hit = (_set_key(combo), combo, v)
            if hit is not None:
                if found is None or (hit[0], node_id) < (found[0], found[1]):
                    found = (hit[0], node_id, hit[1], hit[2])
                break
    if found is not None:
        return _preempt(name, found[3], found[2])
    return Preemption(name, "nothing", None, (), message="no node can take a replica, and taking replicas of "
                      f"lower classes than {deployment.capacity_class} (down to each one's floor) makes no room")


def _fits_floors(combo: Sequence[Holder], holders: Holders) -> bool:
    """No deployment below its floor and no tenant below its guaranteed GPUs once ``combo`` is gone."""
    per: dict[str, int] = {}
    gpus: dict[str, int] = {}
    for h in combo:
        per[h.deployment] = per.get(h.deployment, 0) + 1
        if h.tenant is not None:
            gpus[h.tenant] = gpus.get(h.tenant, 0) + len(h.gpus)
    if not all(n <= holders.spare(d) for d, n in per.items()):
        return False
    return all((keeps := holders.spare_gpus(t)) is None or n <= keeps for t, n in gpus.items())


def _preempt(name: str, verdict: NodeVerdict, victims: Sequence[Holder]) -> Preemption:
    ordered = tuple(sorted(victims, key=lambda h: h.key))
    who = ", ".join(f"{v.replica_id} ({v.deployment}, {v.capacity_class})" for v in ordered)
    return Preemption(name, "preempt", verdict.node, verdict.gpus, victims=ordered,
                      message=f"preempting {who} on {verdict.node} makes room")
