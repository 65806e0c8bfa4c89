"""How many more replicas of a profile fit now: per node, per site, without preemption and with it
(per capacity class), and what binds. Pure.

A node's count is what repeated placement on it would give: each replica takes ``gpu.count``
GPUs in whole IOMMU groups (``scheduler.choose_groups`` on ``scheduler.free_gpus``, the same
first fit placement uses; HGX boards take 1 GPU or the whole board), ``cpu`` and ``memory_gib``
of what the node offers less what its replicas hold. The count is the least of the three, and
the binding constraint is the one that stops it:
  GPUs        no free GPU of a kind the profile accepts is left (or too few for gpu.count)
  VRAM        free GPUs exist but none has the profile's VRAM
  GPU model   free GPUs exist but none is the profile's gpu.model
  MIG slices  the profile runs on a MIG slice and no free slice of its profile is left
  IOMMU groups / HGX shape   free GPUs exist but not in a shape a VM can take
  CPU, memory the node's CPU or memory left
  site rules  the node's site is outside the allowed sites or residency asked for
  disk        (with a model given) the node's model cache has less free disk than the model's
              declared size and does not hold the model (``scheduler.disk_problem``)
  offline, tainted           the node takes nothing
With preemption for class C: the replicas of classes below C are counted as gone, except that
each deployment keeps its floor (autoscaling.min_replicas): its oldest replicas, the ones the
preemption planner would take last. Opportunistic replicas preempt nothing, so only standard and
critical are reported.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from common.schemas import CAPACITY_CLASSES, InferenceProfile, ModelArtifact, Node, Site
from common.sites import site_problem
from controlplane.placement.preemption import Holder, Holders, class_rank
from controlplane.placement.scheduler import (
    NOTHING_COMMITTED,
    Committed,
    SchedulerSettings,
    choose_groups,
    disk_problem,
    free_gpus,
    hgx_shape_problem,
    node_online,
)

PREEMPTING_CLASSES = tuple(c for c in CAPACITY_CLASSES if class_rank(c) > 0)


@dataclass(frozen=True)
class NodeFit:
    node: str
    site: str
    fits: int
    binding: str
    detail: str = ""
    with_preemption: dict[str, int] = field(default_factory=dict)


def _gpu_binding(why: Mapping[str, int], profile: InferenceProfile) -> str:
    """Name what made free GPUs unusable, from free_gpus' reasons."""
    text = " ".join(why)
    if profile.gpu.mig_profile:
        return "MIG slices"
    if "under" in text and "GiB" in text:
        return "VRAM"
    if "not a " in text and "MIG" not in text:
        return "GPU model"
    if "IOMMU" in text:
        return "IOMMU groups"
    return "GPUs"


def gpu_fits(node: Node, profile: InferenceProfile, reserved: Collection[str],
             settings: SchedulerSettings) -> tuple[int, str, str]:
    """(replicas the node's GPUs take, binding, detail): repeated first-fit group choices."""
    need = profile.gpu.count
    shape = hgx_shape_problem(node, need)
    if shape:
        return 0, "HGX shape", shape
    taken = set(reserved)
    count = 0
    first_why: dict[str, int] = {}
    while True:
        usable, why = free_gpus(node, profile, taken, settings)
        if count == 0:
            first_why = {k: v for k, v in why.items() if k != "reserved"}
        if len(usable) < need:
            if count == 0 and not usable and first_why:
                return 0, _gpu_binding(first_why, profile), ", ".join(f"{n} {w}" for w, n in sorted(first_why.items()))
            return count, ("MIG slices" if profile.gpu.mig_profile else "GPUs"), f"{len(usable)} usable GPU(s) left"
        chosen, problem = choose_groups(node, usable, need)
        if problem:
            return count, "IOMMU groups", problem
        taken.update(chosen)
        count += 1


def node_fit(node: Node, profile: InferenceProfile, reserved: Collection[str], committed: Committed, now: float,
             settings: SchedulerSettings, site_rule: str | None = None,
             model: ModelArtifact | None = None) -> tuple[int, str, str]:
    """(replicas that fit on the node, binding constraint, detail)."""
    if not node_online(node, now, settings):
        return 0, "offline", f"last heartbeat {now - node.last_heartbeat:.0f}s ago"
    if node.taints:
        return 0, "tainted", ", ".join(node.taints)
    if node.cordoned:
        return 0, "cordoned", node.cordoned
    if site_rule:
        return 0, "site rules", site_rule
    disk = disk_problem(node, model) if model is not None else None
    if disk:
        return 0, "disk", disk
    gpus, gpu_binding, gpu_detail = gpu_fits(node, profile, reserved, settings)
    cpu_left = node.cpu_free - committed.cpu
    cpus = max(0, cpu_left // profile.cpu)
    memory_left = round(node.memory_free_gib - committed.memory_gib, 6)
    memory = 0
    while round(memory_left - (memory + 1) * profile.memory_gib, 6) >= 0 and memory <= gpus:
        memory += 1  # stepwise, as placement subtracts: no float division surprises
    count = min(gpus, cpus, memory)
    if count == gpus:
        return count, gpu_binding, gpu_detail
    if count == cpus:
        return count, "CPU", f"{cpu_left} CPU left, {profile.cpu} a replica"
    return count, "memory", f"{memory_left:g} GiB left, {profile.memory_gib:g} a replica"


def removable(holders: Holders, below_rank: int, taker: str | None = None) -> dict[str, list[Holder]]:
    """node -> replicas a class of ``below_rank`` of tenant ``taker`` could take (each deployment
    keeps its floor, its oldest replicas; other tenants' only where the planner would take them,
    ``Holders.may_take``) plus the draining ones (their room is on its way)."""
    by_dep: dict[str, list[Holder]] = {}
    for h in holders.ordered:
        if class_rank(h.capacity_class) < below_rank and holders.may_take(taker, h.tenant):
            by_dep.setdefault(h.deployment, []).append(h)
    out: dict[str, list[Holder]] = {}
    for dep, hs in by_dep.items():
        keep = holders.floors.get(dep, 0)
        for h in hs[:max(0, len(hs) - keep)]:  # ordered youngest first: the oldest ``keep`` stay
            out.setdefault(h.node, []).append(h)
    for node, hs in holders.by_node.items():
        out.setdefault(node, []).extend(h for h in hs if h.draining)
    return out


def fit(profile: InferenceProfile, nodes: Sequence[Node], reservations: Mapping[str, Collection[str]],
        committed: Mapping[str, Committed], now: float, settings: SchedulerSettings, holders: Holders, *,
        allowed_sites: Sequence[str] = (), residency: str | None = None,
        sites: Mapping[str, Site] | None = None, model: ModelArtifact | None = None,
        taker: str | None = None) -> dict:
    """The answer of GET /api/ai/capacity/fit (see the module docstring); ``taker``: the tenant
    whose replicas would preempt (None: a deployment without a tenant)."""
    draining = {n: [h for h in hs if h.draining] for n, hs in holders.by_node.items()}
    take = {c: removable(holders, class_rank(c), taker) for c in PREEMPTING_CLASSES}
    rows: list[NodeFit] = []
    for node in sorted(nodes, key=lambda n: n.id):
        rule = site_problem(node.site, allowed_sites, residency, sites or {})
        reserved = set(reservations.get(node.id, ()))
        held = committed.get(node.id, NOTHING_COMMITTED)
        # Draining replicas still hold their room now: "without preemption" is what fits now.
        count, binding, detail = node_fit(node, profile, reserved, held, now, settings, rule, model)
        more = {}
        for c in PREEMPTING_CLASSES:
            gone = take[c].get(node.id, [])
            if not gone:
                more[c] = count
                continue
            freed = {g for h in gone for g in h.gpus}
            less = Committed(held.cpu - sum(h.cpu for h in gone),
                             round(held.memory_gib - sum(h.memory_gib for h in gone), 6), held.replicas - len(gone))
            more[c] = node_fit(node, profile, reserved - freed, less, now, settings, rule, model)[0]
        rows.append(NodeFit(node.id, node.site, count, binding, detail, more))
    del draining
    by_site: dict[str, dict] = {}
    for r in rows:
        s = by_site.setdefault(r.site, {"site": r.site, "fits": 0, "with_preemption": dict.fromkeys(
            PREEMPTING_CLASSES, 0), "binding": {}})
        s["fits"] += r.fits
        for c, n in r.with_preemption.items():
            s["with_preemption"][c] += n
        s["binding"][r.binding] = s["binding"].get(r.binding, 0) + 1
    bindings: dict[str, int] = {}
    for r in rows:
        bindings[r.binding] = bindings.get(r.binding, 0) + 1
    return {
        "profile": profile.name,
        "model": model.name if model is not None else None,
        "replica": {"gpus": profile.gpu.count, "vram_gib": profile.gpu.vram_gib, "gpu_model": profile.gpu.model,
                    "mig_profile": profile.gpu.mig_profile, "cpu": profile.cpu, "memory_gib": profile.memory_gib},
        "fits": sum(r.fits for r in rows),
        "with_preemption": {c: sum(r.with_preemption[c] for r in rows) for c in PREEMPTING_CLASSES},
        "binding": _top(bindings),
        "nodes": [{"node": r.node, "site": r.site, "fits": r.fits, "binding": r.binding, "detail": r.detail,
                   "with_preemption": r.with_preemption} for r in rows],
        "sites": [{**s, "binding": _top(s["binding"])} for _, s in sorted(by_site.items())],
    }


def gpus_by_class(replicas: Sequence, deployments: Mapping) -> dict[str, int]:
    """GPUs (and MIG slices) held by replicas, by their deployment's capacity class (every phase
    but Deleting: a draining replica still holds its GPUs). GET /api/ai/capacity and fabricd's
    fabric_gpus_by_class gauge both show this."""
    out = dict.fromkeys(CAPACITY_CLASSES, 0)
    for r in replicas:
        owner = deployments.get(r.deployment)
        if owner is not None and r.phase != "Deleting":
            out[owner.capacity_class] = out.get(owner.capacity_class, 0) + len(r.gpus)
    return out


def _top(counts: Mapping[str, int]) -> str | None:
    """The binding constraint most nodes share (ties by name), or None without nodes."""
    return min(counts, key=lambda k: (-counts[k], k)) if counts else None
