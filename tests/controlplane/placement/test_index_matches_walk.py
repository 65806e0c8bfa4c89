"""The free-capacity index gives the walk's plan (tests/controlplane/placement/oracle.py) for the
same inputs: random clusters (sites, failure domains, GPU kinds, MIG slices, IOMMU groups, HGX
boards, reservations, CPU/memory held, cached models, taints, offline nodes), random deployment
site rules and profiles, and several replicas placed in a row (the index reserving each)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.schemas import (
    GpuInfo,
    GpuRequest,
    InferenceDeployment,
    InferenceProfile,
    ModelArtifact,
    Node,
    Replica,
    Site,
)
from controlplane.placement.index import PlacementIndex, place
from controlplane.placement.scheduler import Committed, SchedulerSettings
from tests.controlplane.placement.oracle import walk_place

NOW = 1_000_000.0
DIGEST = "a" * 64
SITES = ["", "eu", "us", "in"]
NAMES = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA L4"]


@st.composite
def gpus_of(draw, nid: str) -> list[GpuInfo]:
    out = []
    for i in range(draw(st.integers(0, 6))):
        pci = f"0000:{0x10 + i:02x}:00.0"
        group = draw(st.sampled_from(["", str(i), str(i // 2)]))
        if draw(st.integers(0, 9)) == 0:  # a GPU in MIG mode with two slices
            out.append(GpuInfo(index=i, uuid=f"{nid}-{i}", name=NAMES[0], pci=pci, memory_total_mib=81920,
                               mig_mode=True, iommu_group=group))
            for s in range(2):
                prof = draw(st.sampled_from(["1g.10gb", "3g.40gb"]))
                out.append(GpuInfo(index=i, uuid=f"{nid}-{i}-{s}", name=NAMES[0], pci=f"{pci}/mig{s}",
                                   memory_total_mib=10240 if prof == "1g.10gb" else 40960, mig_profile=prof,
                                   mig_parent=pci))
            continue
        out.append(GpuInfo(index=i, uuid=f"{nid}-{i}", name=draw(st.sampled_from(NAMES)), pci=pci,
                           memory_total_mib=draw(st.sampled_from([24576, 40960, 81920])),
                           temperature_c=draw(st.sampled_from([40.0, 90.0])),
                           ecc_uncorrected=draw(st.sampled_from([0, 0, 0, 1])),
                           state=draw(st.sampled_from(["ok"] * 9 + ["lost"])), iommu_group=group))
    return out


@st.composite
def clusters(draw):
    n = draw(st.integers(0, 14))
    nodes = []
    for _ in range(n):
        nid = f"n{draw(st.integers(0, 40)):02d}"
        if any(x.id == nid for x in nodes):
            continue
        gpus = draw(gpus_of(nid))
        nodes.append(Node(
            id=nid, address=f"https://{nid}:7443", site=draw(st.sampled_from(SITES)),
            failure_domain=draw(st.sampled_from(["r1", "r2", "r3", nid])),
            taints=["maint"] if draw(st.integers(0, 9)) == 0 else [], gpus=gpus,
            cpu_free=draw(st.sampled_from([4, 16, 64])), memory_free_gib=draw(st.sampled_from([16.0, 64.0, 256.0])),
            cached_models=draw(st.sampled_from([[], ["m"], [DIGEST], ["hf://o/m"]])),
            nvswitches=["0000:90:00.0"] if draw(st.integers(0, 7)) == 0 else [],
            model_disk_free_bytes=draw(st.sampled_from([None, None, 10 * 2**30, 100 * 2**30])),
            last_heartbeat=NOW - draw(st.sampled_from([1.0, 5.0, 90.0]))))
    reservations = {}
    committed = {}
    for node in nodes:
        taken = [g.pci for g in node.gpus if draw(st.integers(0, 3)) == 0]
        if taken:
            reservations[node.id] = set(taken)
        if draw(st.booleans()):
            committed[node.id] = Committed(draw(st.sampled_from([0, 4, 12])), draw(st.sampled_from([0.0, 8.0, 40.0])),
                                           1)
    ids = [x.id for x in nodes] + ["gone"]
    replicas = [Replica(replica_id=f"d-{k}", deployment="d", ordinal=k, node=draw(st.sampled_from(ids)))
                for k in range(draw(st.integers(0, 5)))]
    dep = InferenceDeployment(
        name="d", model="m", profile="p", replicas=8,
        allowed_sites=draw(st.sampled_from([[], ["eu"], ["eu", "us"]])),
        residency=draw(st.sampled_from([None, None, "europe"])),
        preferred_site=draw(st.sampled_from([None, "eu", "us"])),
        minimum_sites=draw(st.sampled_from([0, 0, 2])),
        max_replicas_per_site=draw(st.sampled_from([None, None, 1, 2])))
    mig = draw(st.sampled_from([None, None, None, "1g.10gb", "3g.40gb"]))
    prof = InferenceProfile(name="p", cpu=draw(st.sampled_from([1, 4, 8])),
                            memory_gib=draw(st.sampled_from([4.0, 16.0, 48.0])),
                            gpu=GpuRequest(count=1 if mig else draw(st.integers(1, 4)), mig_profile=mig,
                                           vram_gib=draw(st.sampled_from([8, 24, 40, 80])),
                                           model=draw(st.sampled_from([None, None, "H100", "A100"]))))
    model = ModelArtifact(name="m", source="hf://o/m", digest=draw(st.sampled_from([None, DIGEST])),
                          size_bytes=draw(st.sampled_from([None, 50 * 2**30])))
    sets = SchedulerSettings(max_gpu_temp_c=draw(st.sampled_from([None, 85.0])), reject_ecc=draw(st.booleans()))
    exclude = set(draw(st.lists(st.sampled_from(ids), max_size=2)))
    return nodes, reservations, committed, replicas, dep, prof, model, sets, exclude


SITE_RECORDS = {"eu": Site(name="eu", residency="europe"), "us": Site(name="us")}


def same(a, b) -> None:
    assert (a.node, a.gpus) == (b.node, b.gpus)
    assert a.message == b.message
    assert a.verdicts == b.verdicts


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_index_gives_the_walks_plan_replica_after_replica(case):
    nodes, reservations, committed, replicas, dep, prof, model, sets, exclude = case
    index = PlacementIndex(nodes, reservations, NOW, sets, committed=committed, sites=SITE_RECORDS)
    reservations = {k: set(v) for k, v in reservations.items()}
    committed = dict(committed)
    placed = list(replicas)
    plans = []
    for k in range(4):
        want = walk_place(dep, prof, model, nodes, reservations, NOW, sets, replicas=placed, exclude=exclude,
                          committed=committed, sites=SITE_RECORDS)
        got = index.place(dep, prof, model, replicas=placed, exclude=exclude)
        same(got, want)
        same(place(dep, prof, model, nodes, reservations, NOW, sets, replicas=placed, exclude=exclude,
                   committed=committed, sites=SITE_RECORDS), want)
        if want.node is None:
            break
        plans.append(want)
        index.reserve(want.node, want.gpus, prof)
        reservations.setdefault(want.node, set()).update(want.gpus)
        committed[want.node] = committed.get(want.node, Committed()).plus(prof)
        placed.append(Replica(replica_id=f"new-{k}", deployment="d", ordinal=10 + k, node=want.node))
        if k == 1:  # the first one leaves again: release gives its room back
            gone = placed.pop(-2) if len(placed) >= 2 and placed[-2].replica_id == "new-0" else None
            if gone is not None:
                first = plans[0]
                index.release(first.node, first.gpus, prof.cpu, prof.memory_gib)
                reservations[first.node] -= set(first.gpus)
                c = committed[first.node]
                committed[first.node] = Committed(c.cpu - prof.cpu, round(c.memory_gib - prof.memory_gib, 6),
                                                  c.replicas - 1)


def test_a_large_uniform_fleet_is_placed_like_the_walk():
    """Many nodes of one kind in a few racks (the bench's shape), spread over 40 replicas."""
    gpus = [GpuInfo(index=i, uuid=f"g{i}", name=NAMES[0], pci=f"0000:{0x10 + i:02x}:00.0", memory_total_mib=81920)
            for i in range(8)]
    nodes = [Node(id=f"n{i:03d}", address="https://x:1", failure_domain=f"rack{i % 7}", gpus=gpus, cpu_free=32,
                  memory_free_gib=128, cached_models=["m"] if i % 11 == 0 else [], last_heartbeat=NOW)
             for i in range(120)]
    dep = InferenceDeployment(name="d", model="m", profile="p", replicas=40)
    prof = InferenceProfile(name="p", gpu=GpuRequest(count=2, vram_gib=40), cpu=8, memory_gib=32)
    model = ModelArtifact(name="m", source="hf://o/m")
    index = PlacementIndex(nodes, {}, NOW)
    reserved: dict[str, set[str]] = {}
    committed: dict[str, Committed] = {}
    placed: list[Replica] = []
    for k in range(40):
        want = walk_place(dep, prof, model, nodes, reserved, NOW, replicas=placed, committed=committed)
        got = index.place(dep, prof, model, replicas=placed)
        assert (got.node, got.gpus, got.message) == (want.node, want.gpus, want.message)
        index.reserve(got.node, got.gpus, prof)
        reserved.setdefault(got.node, set()).update(got.gpus)
        committed[got.node] = committed.get(got.node, Committed()).plus(prof)
        placed.append(Replica(replica_id=f"d-{k}", deployment="d", ordinal=k, node=got.node))


def test_release_gives_a_full_node_back():
    gpus = [GpuInfo(index=0, uuid="g0", name=NAMES[0], pci="0000:10:00.0", memory_total_mib=81920)]
    nodes = [Node(id="a", address="https://x:1", gpus=gpus, cpu_free=8, memory_free_gib=64, last_heartbeat=NOW)]
    dep = InferenceDeployment(name="d", model="m", profile="p", replicas=2)
    prof = InferenceProfile(name="p", gpu=GpuRequest(count=1, vram_gib=40), cpu=4, memory_gib=16)
    model = ModelArtifact(name="m", source="hf://o/m")
    index = PlacementIndex(nodes, {}, NOW)
    first = index.place(dep, prof, model)
    index.reserve(first.node, first.gpus, prof)
    assert index.place(dep, prof, model).node is None
    index.release(first.node, first.gpus, prof.cpu, prof.memory_gib)
    again = index.place(dep, prof, model)
    assert (again.node, again.gpus, again.message) == (first.node, first.gpus, first.message)
