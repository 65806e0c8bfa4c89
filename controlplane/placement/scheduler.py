"""Replica placement: filter nodes, then score the survivors. Pure and deterministic.

Filters, in order (the first that fails is the node's rejection reason):
  online      heartbeat younger than ``offline_after_s`` (60 s)
  taints      a tainted node takes nothing
  kvm         a node whose agent reports KVM not usable (agent.hw.kvm's probe) takes no GPU
              replica: its agent would refuse it (a GPU guest never runs under TCG)
  site        deployment.allowed_sites, the deployment's residency (copied from the model at
              create) and the model's residency (common.sites.site_problem: a node with no site
              is excluded when any is set; a site is in residency R when its record says R or
              it is named R); then ``max_replicas_per_site`` (the site already holds that many
              of the deployment's replicas) and ``minimum_sites`` (while the deployment's
              replicas span fewer sites than that, a site already used takes no more)
  gpus        ``gpu.count`` free GPUs on this one node, each with at least the profile's VRAM,
              the GPU model filter, under FABRIC_MAX_GPU_TEMP_C and, with FABRIC_REJECT_ECC=1,
              without uncorrected ECC errors or a pending/failed row remap; MIG-mode and lost
              GPUs are not whole GPUs. An IOMMU group is one unit (VFIO gives a group to one VM):
              a replica takes whole groups whose GPUs add up to exactly ``gpu.count``, and a group
              with one GPU taken is taken. On an HGX board (the node reports NVSwitches) only 1 GPU
              or the whole board (full passthrough with the NVSwitches) is a valid shape
  resources   the CPU and memory the node offers to replicas (its allocatable: the agent reports
              its CPU count and MemAvailable, or `serve --cpus/--memory-gib`), less what the
              replicas already on it hold (``committed``), must cover the profile's cpu and
              memory_gib. Dry-run nodes are no exception: they start no VM, but a replica there
              stands for one that would, so a simulated node fills up like a real one.
Scores: model already cached (+100; by its digest once one is known, see ``model_cached``), the deployment's preferred site (+50), spread: -30 per
replica of the deployment already in the node's failure domain and -10 more per one on the node.
Ties break on node id, and GPUs are chosen in PCI order, so the same inputs give the same plan.
``controlplane.placement.index.place`` finds that plan through a free-capacity index instead of
judging every node: the index skips only nodes these filters would reject and judges the rest
with ``judge_node``, best possible score first (tests/controlplane/placement checks it against the
walk on random clusters).

``committed`` (node id -> Committed) is what ``committed_resources`` computes from the replica
records: every replica of every deployment holds its profile's cpu and memory_gib on its node in
every phase, draining (its VM runs until the grace ends) and Deleting (the record goes only
after the agent deleted the VM and released its GPUs, the same rule as GPU reservations) alike.
A replica frees its share when its record is removed. Replicas whose deployment or profile is
gone hold nothing (nothing says how much they hold).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.schemas import GpuInfo, InferenceDeployment, InferenceProfile, ModelArtifact, Node, Replica, Site
from common.sites import site_problem

SCORE_CACHED = 100
SCORE_PREFERRED_SITE = 50
PENALTY_SAME_DOMAIN = 30
PENALTY_SAME_NODE = 10


@dataclass(frozen=True)
class SchedulerSettings:
    offline_after_s: float = 60.0
    max_gpu_temp_c: float | None = None
    reject_ecc: bool = False
    # FABRIC_MAX_GPU_TEMP_C and FABRIC_REJECT_ECC, read and checked by controlplane.settings.load


@dataclass(frozen=True)
class Committed:
    """CPU and memory the replicas on one node hold, and how many replicas that is."""

    cpu: int = 0
    memory_gib: float = 0.0
    replicas: int = 0

    def plus(self, profile: InferenceProfile) -> Committed:
        return Committed(self.cpu + profile.cpu, self.memory_gib + profile.memory_gib, self.replicas + 1)


NOTHING_COMMITTED = Committed()


def committed_resources(
    replicas: Iterable[Replica],
    deployments: Mapping[str, InferenceDeployment],
    profiles: Mapping[str, InferenceProfile],
    profile_of: Callable[[Replica], InferenceProfile | None] | None = None,
) -> dict[str, Committed]:
    """node id -> what the given replicas hold there (their deployment's profile cpu/memory_gib;
    ``profile_of`` names another per replica, e.g. its own revision's during a rollout)."""
    out: dict[str, Committed] = {}
    for r in replicas:
        dep = deployments.get(r.deployment)
        if profile_of is not None:
            profile = profile_of(r)
        else:
            profile = profiles.get(dep.profile) if dep is not None else None
        if profile is None or not r.node:
            continue
        out[r.node] = out.get(r.node, NOTHING_COMMITTED).plus(profile)
    return out


def _held(committed: Committed) -> str:
    n = committed.replicas
    return f" after {n} replica{'s' if n != 1 else ''}" if n else ""


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    eligible: bool
    reason: str
    score: int = 0
    gpus: tuple[str, ...] = ()


class PlacementPlan:
    """Where one new replica goes (``node`` None: nowhere) and why, with every node's verdict.

    ``verdicts`` may be given as a function: they are computed when first read (explain reads
    them; the loops need only the choice). A ``message`` of None is the failure message, built
    from the verdicts when read (it names every node's reason)."""

    __slots__ = ("_message", "_verdicts", "deployment", "gpus", "node")

    def __init__(self, deployment: str, node: str | None, gpus: tuple[str, ...], message: str | None,
                 verdicts: tuple[NodeVerdict, ...] | Callable[[], tuple[NodeVerdict, ...]] = ()):
        self.deployment = deployment
        self.node = node
        self.gpus = tuple(gpus)
        self._message = message
        self._verdicts = verdicts

    @property
    def verdicts(self) -> tuple[NodeVerdict, ...]:
        if callable(self._verdicts):
            self._verdicts = tuple(self._verdicts())
        return self._verdicts

    @property
    def message(self) -> str:
        if self._message is None:
            self._message = "no node can take a replica: " + "; ".join(f"{v.node}: {v.reason}"
                                                                       for v in self.verdicts)
        return self._message

    @property
    def rejected(self) -> dict[str, str]:
        return {v.node: v.reason for v in self.verdicts if v.node != self.node}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlacementPlan):
            return NotImplemented
        return ((self.deployment, self.node, self.gpus, self.message, self.verdicts)
                == (other.deployment, other.node, other.gpus, other.message, other.verdicts))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PlacementPlan({self.deployment!r}, node={self.node!r}, gpus={self.gpus!r})"


def disk_problem(node: Node, model: ModelArtifact) -> str | None:
    """A node whose model cache has less free disk than the model's declared size cannot take it
    (the download would fail there and hold the GPUs meanwhile), unless it holds the model
    already. Unknown on either side (no declared size, a node that does not report its free disk)
    is no refusal."""
    free = node.model_disk_free_bytes
    if model.size_bytes is None or free is None or model_cached(model, node) or model.size_bytes <= free:
        return None
    return (f"not enough free disk for model {model.name}: {model.size_bytes / 2**30:.1f} GiB declared, "
            f"{free / 2**30:.1f} GiB free in the model cache")


def node_online(node: Node, now: float, settings: SchedulerSettings) -> bool:
    return now - node.last_heartbeat < settings.offline_after_s


def _gpu_problem(gpu: GpuInfo, profile: InferenceProfile, settings: SchedulerSettings) -> str | None:
    wanted = profile.gpu.mig_profile
    if wanted and gpu.mig_profile != wanted:
        return f"not a {wanted} MIG slice"
    if not wanted and gpu.mig_profile:
        return "a MIG slice"
    if gpu.state != "ok":
        return f"{gpu.state} (fell off the bus?)" if gpu.state == "lost" else gpu.state
    if gpu.mig_mode:
        return "in MIG mode"
    if profile.gpu.model and profile.gpu.model.lower() not in gpu.name.lower():
        return f"not a {profile.gpu.model}"
    if gpu.memory_total_mib <= 0:  # never read by NVML and not in the agent's board table
        return f"memory unknown ({gpu.name or gpu.pci_id}: not sized)"
    if gpu.memory_total_mib < profile.gpu.vram_gib * 1024:
        return f"under {profile.gpu.vram_gib:g} GiB"
    if settings.max_gpu_temp_c is not None and gpu.temperature_c > settings.max_gpu_temp_c:
        return f"hotter than {settings.max_gpu_temp_c:g} C"
    if settings.reject_ecc and gpu.ecc_uncorrected > 0:
        return "has ECC errors"
    if settings.reject_ecc and gpu.remapped_rows_failed:
        return "row remapping failed"
    if settings.reject_ecc and gpu.remapped_rows_pending:
        return "row remap pending (needs a GPU reset)"
    return None


def free_gpus(node: Node, profile: InferenceProfile, reserved: Collection[str], settings: SchedulerSettings):
    """(usable PCI addresses in PCI order, counts of why the others are unusable).

    A GPU is usable only when every GPU of its IOMMU group is (a group moves to one VM whole)."""
    problems: dict[str, str | None] = {}
    for gpu in node.gpus:
        problems[gpu.pci] = "reserved" if gpu.pci in reserved else _gpu_problem(gpu, profile, settings)
    why: dict[str, int] = {}
    usable: list[str] = []
    for gpu in sorted(node.gpus, key=lambda g: g.pci):
        problem = problems[gpu.pci]
        if problem is None:
            mates = [g.pci for g in node.gpus if _group(gpu) and _group(g) == _group(gpu)]
            if any(problems[m] for m in mates):
                problem = f"sharing IOMMU group {gpu.iommu_group} with an unusable GPU"
        if problem:
            why[problem] = why.get(problem, 0) + 1
        else:
            usable.append(gpu.pci)
    return usable, why


def _group(gpu: GpuInfo) -> str:
    """The IOMMU group a GPU moves with; a MIG slice is not passed through, so it has none."""
    return "" if gpu.mig_parent else gpu.iommu_group


def choose_groups(node: Node, usable: Sequence[str], need: int) -> tuple[tuple[str, ...], str | None]:
    """Whole IOMMU groups from ``usable`` adding up to exactly ``need`` GPUs (first fit in PCI
    order, then the smallest groups), or () with why not."""
    group_of = {g.pci: (_group(g) or g.pci) for g in node.gpus}
    groups: dict[str, list[str]] = {}
    for pci in usable:
        groups.setdefault(group_of.get(pci, pci), []).append(pci)
    units = sorted(groups.values(), key=lambda members: members[0])
    chosen = _subset_with_size(units, need)
    if chosen is None:
        sizes = ", ".join(str(len(u)) for u in units)
        return (), (f"no whole IOMMU groups add up to {need} GPU(s): free groups hold {sizes} GPU(s) "
                    "(GPUs in one group go to one VM together)")
    return tuple(sorted(pci for unit in chosen for pci in unit)), None


def _subset_with_size(units: list[list[str]], need: int) -> list[list[str]] | None:
    # Groups hold 1-2 GPUs on real boards and a node has at most 8-16: a small exact search.
    best: list[list[str]] | None = None

    def walk(i: int, picked: list[list[str]], count: int) -> bool:
        nonlocal best
        if count == need:
            best = list(picked)
            return True
        if i == len(units) or count > need:
            return False
        return walk(i + 1, picked + [units[i]], count + len(units[i])) or walk(i + 1, picked, count)

    walk(0, [], 0)
    return best


def hgx_shape_problem(node: Node, need: int) -> str | None:
    """On a board with NVSwitches, only 1 GPU or every GPU (full passthrough) works: a partial
    multi-GPU VM has no fabric manager to train its NVLinks (CUDA init fails: system not ready)."""
    board = len([g for g in node.gpus if not g.mig_parent])
    if not node.nvswitches or need <= 1 or need == board:
        return None
    return (f"HGX board with {len(node.nvswitches)} NVSwitches: a VM gets 1 GPU or all {board} "
            f"(full passthrough with the NVSwitches), not {need}; shared-NVSwitch partitions are not supported")


def _site_problem(node: Node, deployment: InferenceDeployment, model: ModelArtifact, replicas: Sequence[Replica],
                  site_of: Mapping[str, str], sites: Mapping[str, Site]) -> str | None:
    for residency, whose in ((deployment.residency, "deployment"), (model.residency, "model")):
        problem = site_problem(node.site, deployment.allowed_sites, residency, sites)
        if problem:
            return problem + (f" (the {whose}'s)" if residency and "residency" in problem else "")
    held: dict[str, int] = {}
    for r in replicas:
        held[site_of.get(r.node, "")] = held.get(site_of.get(r.node, ""), 0) + 1
    cap = deployment.max_replicas_per_site
    if cap is not None and held.get(node.site, 0) >= cap:
        return f"site {node.site!r} already holds {held[node.site]} replica(s): max_replicas_per_site is {cap}"
    used = {s for s, n in held.items() if n}
    if deployment.minimum_sites and len(used) < deployment.minimum_sites and node.site in used:
        return (f"site {node.site!r} already holds a replica and minimum_sites {deployment.minimum_sites} wants "
                f"another site first ({len(used)} used so far)")
    return None


def model_cached(model: ModelArtifact, node: Node) -> bool:
    """Whether the node holds the model's bytes: by digest (what a node verified, or the digest the
    model expects) when one is known; by name or source only from agents without a model cache."""
    digests = {d for d in (model.status.digest, model.digest) if d}
    if digests:
        return bool(digests & set(node.cached_models))
    return model.name in node.cached_models or model.source in node.cached_models


def judge_node(
    node: Node,
    deployment: InferenceDeployment,
    profile: InferenceProfile,
    model: ModelArtifact,
    reserved: Collection[str],
    replicas: Sequence[Replica],
    domains: Mapping[str, str],
    now: float,
    settings: SchedulerSettings,
    committed: Committed = NOTHING_COMMITTED,
    sites: Mapping[str, Site] | None = None,
    site_of: Mapping[str, str] | None = None,
) -> NodeVerdict:
    if not node_online(node, now, settings):
        return NodeVerdict(node.id, False, f"offline: last heartbeat {now - node.last_heartbeat:.0f}s ago")
    if node.taints:
        return NodeVerdict(node.id, False, f"tainted: {', '.join(node.taints)}")
    if node.cordoned:
        return NodeVerdict(node.id, False, f"cordoned: {node.cordoned}")
    if profile.gpu.count > 0 and node.kvm is not None and not node.kvm.usable:
        return NodeVerdict(node.id, False, f"KVM does not work on this node: {node.kvm.reason}")
    where = _site_problem(node, deployment, model, replicas, site_of or {}, sites or {})
    if where:
        return NodeVerdict(node.id, False, where)
    usable, why = free_gpus(node, profile, reserved, settings)
    need = profile.gpu.count
    shape = hgx_shape_problem(node, need)
    if shape:
        return NodeVerdict(node.id, False, shape)
    if len(usable) < need:
        detail = ", ".join(f"{n} {w}" for w, n in sorted(why.items()))
        return NodeVerdict(
            node.id,
            False,
            f"no free matching GPU group: needs {need} with >= {profile.gpu.vram_gib:g} GiB, "
            f"{len(usable)} free of {len(node.gpus)}" + (f" ({detail})" if detail else ""),
        )
    chosen, group_problem = choose_groups(node, usable, need)
    if group_problem:
        return NodeVerdict(node.id, False, group_problem)
    cpu_free = node.cpu_free - committed.cpu
    if cpu_free < profile.cpu:
        return NodeVerdict(
            node.id, False,
            f"not enough CPU: {cpu_free} of {node.cpu_free} free{_held(committed)}, needs {profile.cpu}",
        )
    memory_free = round(node.memory_free_gib - committed.memory_gib, 6)
    if memory_free < profile.memory_gib:
        return NodeVerdict(
            node.id, False,
            f"not enough memory: {memory_free:g} of {node.memory_free_gib:g} GiB free{_held(committed)}, "
            f"needs {profile.memory_gib:g}",
        )
    disk = disk_problem(node, model)
    if disk:
        return NodeVerdict(node.id, False, disk)
    score, parts = 0, []
    if model_cached(model, node):
        score += SCORE_CACHED
        parts.append("model cached")
    if deployment.preferred_site and node.site == deployment.preferred_site:
        score += SCORE_PREFERRED_SITE
        parts.append("preferred site")
    same_domain = sum(1 for r in replicas if domains.get(r.node) == node.failure_domain)
    same_node = sum(1 for r in replicas if r.node == node.id)
    if same_domain or same_node:
        score -= PENALTY_SAME_DOMAIN * same_domain + PENALTY_SAME_NODE * same_node
        parts.append(f"{same_domain} replica(s) in its failure domain")
    reason = f"fits with score {score}" + (f" ({'; '.join(parts)})" if parts else "")
    return NodeVerdict(node.id, True, reason, score, chosen)
