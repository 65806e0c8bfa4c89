"""A free-capacity index over the fleet, so one placement touches candidates, not every node.

Built once from (nodes, reservations, committed, now, settings, sites); ``place`` answers the
plan the full walk answers (``scheduler.judge_node`` over every node in id order, the best score,
ties on node id) and ``reserve`` records a placed replica so the next placement sees it.

Why it gives the walk's plan:
  - a node is judged only after cheap necessary conditions kept per node pass: online and
    untainted (at build), not excluded, at least ``gpu.count`` unreserved GPUs of a kind the
    profile accepts (a kind is every field ``_gpu_problem`` reads, judged once per profile), and
    the CPU and memory left. The node is then judged by ``scheduler.judge_node`` itself, so the
    verdict, score, reason and GPUs are the walk's; the conditions only skip nodes it would reject.
  - a score is 100 (model cached) + 50 (preferred site) - 30 per replica of the deployment in the
    node's failure domain - 10 per one on the node. Nodes holding none of the deployment's
    replicas share one score per (site, failure domain, cached or not), so those groups are
    visited best score first with node ids ascending (groups of equal score merged by id), and the
    first node the judge accepts is the walk's choice. Nodes holding a replica are scored alone.
  - the site filters read only a node's site: they are judged once per site per placement.
  - each group lists only its nodes with an unreserved GPU, so a full fleet costs nothing.
The verdicts of every node (explain) and the failure message (it lists every node) are the
walk's, computed when read.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from common.schemas import GpuInfo, InferenceDeployment, InferenceProfile, ModelArtifact, Node, Replica, Site
from controlplane.placement.scheduler import (
    NOTHING_COMMITTED,
    PENALTY_SAME_DOMAIN,
    PENALTY_SAME_NODE,
    SCORE_CACHED,
    SCORE_PREFERRED_SITE,
    Committed,
    NodeVerdict,
    PlacementPlan,
    SchedulerSettings,
    _gpu_problem,
    _site_problem,
    judge_node,
    node_online,
)

GpuKind = tuple


def gpu_kind(gpu: GpuInfo, settings: SchedulerSettings) -> GpuKind:
    """Everything ``_gpu_problem`` reads of a GPU under ``settings``: GPUs of one kind are
    accepted or refused together by any profile."""
    hot = settings.max_gpu_temp_c is not None and gpu.temperature_c > settings.max_gpu_temp_c
    ecc = settings.reject_ecc
    return (gpu.mig_profile, gpu.state, gpu.mig_mode, gpu.name, gpu.memory_total_mib, hot,
            ecc and gpu.ecc_uncorrected > 0, ecc and gpu.remapped_rows_failed, ecc and gpu.remapped_rows_pending)


class PlacementIndex:
    """Free GPUs per node by kind, grouped by (site, failure domain); see the module docstring."""

    def __init__(self, nodes: Sequence[Node], reservations: Mapping[str, Collection[str]], now: float,
                 settings: SchedulerSettings = SchedulerSettings(), *,
                 committed: Mapping[str, Committed] | None = None, sites: Mapping[str, Site] | None = None):
        self.now = now
        self.settings = settings
        self.sites = dict(sites or {})
        self.nodes: dict[str, Node] = {}
        for n in nodes:
            self.nodes.setdefault(n.id, n)  # the walk judges every entry; ids are unique in practice
        self._all = list(nodes)
        self.committed: dict[str, Committed] = dict(committed or {})
        self.reserved: dict[str, set[str]] = {k: set(v) for k, v in reservations.items()}
        self.domains = {n.id: n.failure_domain for n in nodes}
        self.site_of = {n.id: n.site for n in nodes}
        self._kind_of: dict[tuple[str, str], GpuKind] = {}  # (node, pci) -> kind
        self._sample: dict[GpuKind, GpuInfo] = {}
        self._free: dict[str, dict[GpuKind, int]] = {}
        self._placeable: set[str] = set()
        self._groups: dict[tuple[str, str], list[str]] = {}
        self._cached: dict[str, set[str]] = {}
        self._ok_cache: dict[tuple, frozenset[GpuKind]] = {}
        self._site_sample: dict[str, Node] = {}
        for node in self.nodes.values():
            self._site_sample.setdefault(node.site, node)
            for item in node.cached_models:
                self._cached.setdefault(item, set()).add(node.id)
            taken = self.reserved.get(node.id, ())
            free: dict[GpuKind, int] = {}
            for gpu in node.gpus:
                kind = gpu_kind(gpu, settings)
                self._kind_of[(node.id, gpu.pci)] = kind
                self._sample.setdefault(kind, gpu)
                if gpu.pci not in taken:
                    free[kind] = free.get(kind, 0) + 1
            self._free[node.id] = free
            if node_online(node, now, settings) and not node.taints and not node.cordoned:
                self._placeable.add(node.id)
                if free:
                    self._groups.setdefault((node.site, node.failure_domain), []).append(node.id)
        for members in self._groups.values():
            members.sort()

    # -- bookkeeping ------------------------------------------------------------------------------

    def reserve(self, node_id: str, gpus: Iterable[str], profile: InferenceProfile | None) -> None:
        """A replica placed on ``node_id`` now holds ``gpus`` and its profile's CPU and memory."""
        taken = self.reserved.setdefault(node_id, set())
        free = self._free.get(node_id)
        for pci in gpus:
            if pci in taken:
                continue
            taken.add(pci)
            kind = self._kind_of.get((node_id, pci))
            if free is not None and kind is not None and free.get(kind, 0) > 0:
                free[kind] -= 1
                if not free[kind]:
                    del free[kind]
        if profile is not None:
            self.committed[node_id] = self.committed.get(node_id, NOTHING_COMMITTED).plus(profile)
        node = self.nodes.get(node_id)
        if node is not None and free is not None and not free:
            members = self._groups.get((node.site, node.failure_domain), [])
            i = bisect.bisect_left(members, node_id)
            if i < len(members) and members[i] == node_id:
                members.pop(i)

    def release(self, node_id: str, gpus: Iterable[str], cpu: int, memory_gib: float) -> None:
        """A replica left ``node_id``: its GPUs, CPU and memory are free again (``reserve`` undone)."""
        taken = self.reserved.get(node_id, set())
        free = self._free.get(node_id)
        node = self.nodes.get(node_id)
        was_full = free is not None and not free
        for pci in gpus:
            if pci not in taken:
                continue
            taken.discard(pci)
            kind = self._kind_of.get((node_id, pci))
            if free is not None and kind is not None:
                free[kind] = free.get(kind, 0) + 1
        held = self.committed.get(node_id, NOTHING_COMMITTED)
        self.committed[node_id] = Committed(held.cpu - cpu, round(held.memory_gib - memory_gib, 6),
                                            max(0, held.replicas - 1))
        if node is not None and was_full and free and node_id in self._placeable:
            bisect.insort(self._groups.setdefault((node.site, node.failure_domain), []), node_id)

    def ok_kinds(self, profile: InferenceProfile) -> frozenset[GpuKind]:
        """The GPU kinds this profile's replicas may use."""
        key = (profile.gpu.mig_profile, profile.gpu.model, profile.gpu.vram_gib)
        ok = self._ok_cache.get(key)
        if ok is None:
            ok = frozenset(k for k, g in self._sample.items() if _gpu_problem(g, profile, self.settings) is None)
            self._ok_cache[key] = ok
        return ok

    def free_of(self, node_id: str, ok: Collection[GpuKind]) -> int:
        """Unreserved GPUs on the node of the given kinds (an upper bound on what it can give)."""
        return sum(c for k, c in self._free.get(node_id, {}).items() if k in ok)

    def cached_nodes(self, model: ModelArtifact) -> set[str]:
        """Node ids ``scheduler.model_cached`` says hold the model."""
        digests = {d for d in (model.status.digest, model.digest) if d}
        out: set[str] = set()
        for key in (digests or {model.name, model.source}):
            out |= self._cached.get(key, set())
        return out

    def judge(self, node: Node, deployment: InferenceDeployment, profile: InferenceProfile, model: ModelArtifact,
              replicas: Sequence[Replica]) -> NodeVerdict:
        """``scheduler.judge_node`` with this index's reservations and commitments."""
        return judge_node(node, deployment, profile, model, self.reserved.get(node.id, ()), replicas, self.domains,
                          self.now, self.settings, self.committed.get(node.id, NOTHING_COMMITTED), self.sites,
                          self.site_of)

    def walk(self, deployment: InferenceDeployment, profile: InferenceProfile, model: ModelArtifact,
             replicas: Sequence[Replica], exclude: Collection[str]) -> tuple[NodeVerdict, ...]:
        """Every node's verdict, in id order (what explain shows)."""
        out = []
        for node in sorted(self._all, key=lambda n: n.id):
            if node.id in exclude:
                out.append(NodeVerdict(node.id, False, "excluded: the replica is being moved off this node"))
            else:
                out.append(judge_node(node, deployment, profile, model, self.reserved.get(node.id, ()), replicas,
                                      self.domains, self.now, self.settings,
                                      self.committed.get(node.id, NOTHING_COMMITTED), self.sites, self.site_of))
        return tuple(out)

    # -- the decision -----------------------------------------------------------------------------

    def best(self, deployment: InferenceDeployment, profile: InferenceProfile, model: ModelArtifact, *,
             replicas: Sequence[Replica] = (), exclude: Collection[str] = ()) -> NodeVerdict | None:
        """The verdict of the node the walk would choose, or None when no node fits."""
        need, ok = profile.gpu.count, self.ok_kinds(profile)
        on_node: dict[str, int] = {}
        in_domain: dict[str, int] = {}
        for r in replicas:
            on_node[r.node] = on_node.get(r.node, 0) + 1
            d = self.domains.get(r.node)
            if d is not None:
                in_domain[d] = in_domain.get(d, 0) + 1
        special = {n for n in on_node if n in self.nodes}
        site_ok: dict[str, bool] = {}

        def site_fits(site: str) -> bool:
            hit = site_ok.get(site)
            if hit is None:
                sample = self._site_sample.get(site)
                hit = sample is not None and _site_problem(sample, deployment, model, replicas, self.site_of,
                                                            self.sites) is None
                site_ok[site] = hit
            return hit

        def may_fit(nid: str) -> bool:
            if nid in exclude:
                return False
            if need > sum(c for k, c in self._free[nid].items() if k in ok):
                return False
            node = self.nodes[nid]
            held = self.committed.get(nid, NOTHING_COMMITTED)
            if node.cpu_free - held.cpu < profile.cpu:
                return False
            return round(node.memory_free_gib - held.memory_gib, 6) >= profile.memory_gib

        cached = self.cached_nodes(model)
        preferred = deployment.preferred_site
        streams: dict[int, list[Iterable[str]]] = {}

        def stream(members: list[str], want_cached: bool) -> Iterator[str]:
            for nid in members:
                if (nid in cached) == want_cached and nid not in special and may_fit(nid):
                    yield nid

        for (site, domain), members in self._groups.items():
            if not members or not site_fits(site):
                continue
            value = (SCORE_PREFERRED_SITE if preferred and site == preferred else 0) \
                - PENALTY_SAME_DOMAIN * in_domain.get(domain, 0)
            streams.setdefault(value, []).append(stream(members, False))
            if cached:
                if len(cached) * 4 < len(members):
                    few = sorted(n for n in cached if n in self._placeable and self.nodes[n].site == site
                                 and self.nodes[n].failure_domain == domain and self._free[n])
                    streams.setdefault(value + SCORE_CACHED, []).append(stream(few, True))
                else:
                    streams.setdefault(value + SCORE_CACHED, []).append(stream(members, True))
        for nid in special:
            node = self.nodes[nid]
            if nid in self._placeable and self._free[nid] and site_fits(node.site) and may_fit(nid):
                value = (SCORE_CACHED if nid in cached else 0) \
                    + (SCORE_PREFERRED_SITE if preferred and node.site == preferred else 0) \
                    - PENALTY_SAME_DOMAIN * in_domain.get(node.failure_domain, 0) - PENALTY_SAME_NODE * on_node[nid]
                streams.setdefault(value, []).append((nid,))
        for value in sorted(streams, reverse=True):
            for nid in heapq.merge(*streams[value]):
                verdict = self.judge(self.nodes[nid], deployment, profile, model, replicas)
                if verdict.eligible:
                    return verdict
        return None

    def place(self, deployment: InferenceDeployment, profile: InferenceProfile, model: ModelArtifact, *,
              replicas: Sequence[Replica] = (), exclude: Collection[str] = ()) -> PlacementPlan:
        """The walk's plan for one new replica (see ``place`` below); nothing is reserved."""
        replicas = list(replicas)
        exclude = set(exclude)
        best = self.best(deployment, profile, model, replicas=replicas, exclude=exclude)

        def verdicts() -> tuple[NodeVerdict, ...]:
            return self.walk(deployment, profile, model, replicas, exclude)

        if best is None:
            if not self.nodes:
                return PlacementPlan(deployment.name, None, (), "no nodes are registered", ())
            return PlacementPlan(deployment.name, None, (), None, verdicts)
        return PlacementPlan(deployment.name, best.node, best.gpus, f"chose {best.node}: {best.reason}", verdicts)


def place(
    deployment: InferenceDeployment,
    profile: InferenceProfile,
    model: ModelArtifact,
    nodes: Sequence[Node],
    reservations: Mapping[str, Collection[str]],
    now: float,
    settings: SchedulerSettings = SchedulerSettings(),
    *,
    replicas: Sequence[Replica] = (),
    exclude: Collection[str] = (),
    committed: Mapping[str, Committed] | None = None,
    sites: Mapping[str, Site] | None = None,
) -> PlacementPlan:
    """Choose a node and GPUs for one new replica of ``deployment``.

    ``reservations`` maps node id -> PCI addresses already reserved; ``replicas`` are the
    deployment's live replicas (for spread); ``exclude`` names nodes not to use (replacing a
    replica away from its node); ``committed`` maps node id -> the CPU and memory the replicas
    already there hold (``committed_resources``), subtracted from what the node offers; ``sites``
    maps site name -> its record (residency).

    The plan is the full walk's (every node judged, the best score, ties on node id), found
    through this module's free-capacity index; a caller placing several
    replicas builds one ``PlacementIndex`` and calls its ``place`` and ``reserve`` instead, so the
    index is built once."""
    index = PlacementIndex(nodes, reservations, now, settings, committed=committed, sites=sites)
    return index.place(deployment, profile, model, replicas=replicas, exclude=exclude)
