"""capacity fit: per-node counts equal a brute-force count (place one replica after another on
the node with scheduler.judge_node until it refuses) on random clusters, without preemption and
with it per class; the binding constraint is named."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.schemas import (
    AutoscalingSpec,
    GpuInfo,
    GpuRequest,
    InferenceDeployment,
    InferenceProfile,
    ModelArtifact,
    Node,
    Replica,
)
from controlplane.placement.capacity import fit
from controlplane.placement.index import PlacementIndex
from controlplane.placement.preemption import holders_from, plan_preemption
from controlplane.placement.scheduler import (
    NOTHING_COMMITTED,
    Committed,
    SchedulerSettings,
    committed_resources,
    judge_node,
)
from tests.controlplane.placement.test_index_matches_walk import NAMES, NOW, gpus_of
from tests.controlplane.planner_data import node

CLASSES = ["opportunistic", "standard", "critical"]
HELD = InferenceProfile(name="held", gpu=GpuRequest(count=1, vram_gib=8), cpu=2, memory_gib=8)


def brute(nd: Node, profile, reserved, held: Committed, dep, model) -> int:
    reserved, count = set(reserved), 0
    while count < 64:
        v = judge_node(nd, dep, profile, model, reserved, [], {}, NOW, SchedulerSettings(), held, {}, {})
        if not v.eligible:
            return count
        reserved |= set(v.gpus)
        held = held.plus(profile)
        count += 1
    return count


@st.composite
def cases(draw):
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        nid = f"n{i}"
        nodes.append(Node(id=nid, address="https://x:1", site=draw(st.sampled_from(["", "eu", "us"])),
                          gpus=draw(gpus_of(nid)), cpu_free=draw(st.sampled_from([2, 8, 32])),
                          memory_free_gib=draw(st.sampled_from([8.0, 40.0, 200.0])),
                          taints=["x"] if draw(st.integers(0, 9)) == 0 else [],
                          model_disk_free_bytes=draw(st.sampled_from([None, 10 * 2**30, 100 * 2**30])),
                          cached_models=draw(st.sampled_from([[], ["m"]])),
                          nvswitches=["0000:90:00.0"] if draw(st.integers(0, 9)) == 0 else [],
                          last_heartbeat=NOW - draw(st.sampled_from([1.0, 1.0, 90.0]))))
    deps, replicas = {}, []
    for d in range(draw(st.integers(0, 3))):
        floor = draw(st.sampled_from([None, 0, 1]))
        deps[f"d{d}"] = InferenceDeployment(
            name=f"d{d}", model="m", profile="held", capacity_class=draw(st.sampled_from(CLASSES)),
            autoscaling=AutoscalingSpec(min_replicas=floor, max_replicas=4) if floor is not None else None)
    k = 0
    for nd in nodes:
        for g in nd.gpus:
            if deps and draw(st.integers(0, 2)) == 0:
                replicas.append(Replica(replica_id=f"r{k}", deployment=draw(st.sampled_from(sorted(deps))), ordinal=k,
                                        node=nd.id, gpus=[g.pci], created_at=float(draw(st.integers(0, 50))),
                                        draining=draw(st.integers(0, 6)) == 0))
                k += 1
    mig = draw(st.sampled_from([None, None, "1g.10gb"]))
    profile = InferenceProfile(name="p", cpu=draw(st.sampled_from([1, 4])),
                               memory_gib=draw(st.sampled_from([4.0, 16.0])),
                               gpu=GpuRequest(count=1 if mig else draw(st.integers(1, 3)), mig_profile=mig,
                                              vram_gib=draw(st.sampled_from([8, 40])),
                                              model=draw(st.sampled_from([None, "H100"]))))
    allowed = draw(st.sampled_from([[], ["eu"]]))
    model = ModelArtifact(name="m", source="hf://o/m", size_bytes=draw(st.sampled_from([None, 50 * 2**30])))
    return nodes, deps, replicas, profile, allowed, model


def removed_for(rank, deps, replicas):
    """Independently: lower-class replicas, less each deployment's floor of the ones the planner takes
    last; draining too. The planner takes the youngest first and, at equal created_at, the lower
    replica id first (preemption.py), so the floor kept is the oldest and, among equals, the higher
    ids: not simply the start of an oldest-first, id-ascending sort."""
    out = [r for r in replicas if r.draining]
    for name, d in deps.items():
        if CLASSES.index(d.capacity_class) >= rank:
            continue
        mine = sorted((r for r in replicas if r.deployment == name and not r.draining),
                      key=lambda r: (-r.created_at, r.replica_id))  # victim order: taken first first
        keep = d.autoscaling.min_replicas if d.autoscaling else 0
        out += mine[:max(0, len(mine) - keep)]
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_fit_matches_a_brute_force_count(case):
    nodes, deps, replicas, profile, allowed, model = case
    reservations: dict[str, set[str]] = {}
    for r in replicas:
        reservations.setdefault(r.node, set()).update(r.gpus)
    profiles = {"held": HELD}
    committed = committed_resources(replicas, deps, profiles)
    holders = holders_from(replicas, deps, lambda r: HELD)
    got = fit(profile, nodes, reservations, committed, NOW, SchedulerSettings(), holders, allowed_sites=allowed,
              model=model)
    dep = InferenceDeployment(name="probe", model="m", profile="p", allowed_sites=allowed)
    rows = {r["node"]: r for r in got["nodes"]}
    for nd in nodes:
        want = brute(nd, profile, reservations.get(nd.id, set()), committed.get(nd.id, NOTHING_COMMITTED), dep, model)
        assert rows[nd.id]["fits"] == want, (nd.id, rows[nd.id])
        for cls in ("standard", "critical"):
            gone = [r for r in removed_for(CLASSES.index(cls), deps, replicas) if r.node == nd.id]
            reserved = reservations.get(nd.id, set()) - {g for r in gone for g in r.gpus}
            left = committed_resources([r for r in replicas if r not in gone], deps, profiles).get(
                nd.id, NOTHING_COMMITTED)
            assert rows[nd.id]["with_preemption"][cls] == brute(nd, profile, reserved, left, dep, model), (nd.id, cls)
    assert got["fits"] == sum(r["fits"] for r in got["nodes"])
    for s in got["sites"]:
        assert s["fits"] == sum(r["fits"] for r in got["nodes"] if r["site"] == s["site"])


P = InferenceProfile(name="p", gpu=GpuRequest(count=1, vram_gib=40), cpu=4, memory_gib=16)


def one(nodes, profile=P, **kw):
    reservations = kw.pop("reservations", {})
    committed = kw.pop("committed", {})
    return fit(profile, nodes, reservations, committed, NOW, SchedulerSettings(), holders_from([], {}, lambda r: None),
               **kw)


def test_the_binding_constraint_is_named():
    assert one([node("a", 4, age=5)])["nodes"][0] == {
        "node": "a", "site": "default", "fits": 4, "binding": "GPUs", "detail": "0 usable GPU(s) left",
        "with_preemption": {"standard": 4, "critical": 4}}
    assert one([node("a", 4, cpu=8)])["nodes"][0]["binding"] == "CPU"
    assert one([node("a", 4, mem=20)])["nodes"][0]["binding"] == "memory"
    small = node("a", gpus=[GpuInfo(index=0, uuid="g", name=NAMES[0], pci="0000:10:00.0", memory_total_mib=24576)])
    assert (one([small])["nodes"][0]["binding"], one([small])["fits"]) == ("VRAM", 0)
    mig = InferenceProfile(name="m", gpu=GpuRequest(count=1, vram_gib=8, mig_profile="1g.10gb"), cpu=1, memory_gib=1)
    assert one([node("a", 2)], mig)["nodes"][0]["binding"] == "MIG slices"
    assert one([node("a", 2, site="us")], allowed_sites=["eu"])["nodes"][0]["binding"] == "site rules"
    assert one([node("a", 2, age=90)])["nodes"][0]["binding"] == "offline"
    assert one([node("a", 2, taints=["m"])])["nodes"][0]["binding"] == "tainted"
    big = ModelArtifact(name="m", source="hf://o/m", size_bytes=50 * 2**30)
    full = node("a", 2).model_copy(update={"model_disk_free_bytes": 10 * 2**30})
    assert one([full], model=big)["nodes"][0]["binding"] == "disk"
    assert one([full])["nodes"][0]["fits"] == 2  # no model given: disk is not judged
    got = one([node("a", 2), node("b", 2, site="eu")])
    assert [(s["site"], s["fits"]) for s in got["sites"]] == [("default", 2), ("eu", 2)]


def test_the_floor_kept_at_equal_ages_is_the_one_the_planner_takes_last():
    """Regression (hypothesis, fresh machine: n3 'standard' 2 != 0): two replicas of a deployment
    with a floor of 1 and the same created_at on two nodes. The planner takes the lower replica id
    first, so with preemption the room is on that one's node; the brute-force model had kept the
    lower id (oldest first, then id ascending) and so counted the room on the other node."""
    nodes = [node("a", 2, cpu=2, mem=8), node("b", 2, cpu=2, mem=8)]
    deps = {"d0": InferenceDeployment(name="d0", model="m", profile="held", capacity_class="opportunistic",
                                      autoscaling=AutoscalingSpec(min_replicas=1, max_replicas=4))}
    replicas = [Replica(replica_id="r0", deployment="d0", ordinal=0, node="a", gpus=[nodes[0].gpus[0].pci],
                        created_at=1.0),
                Replica(replica_id="r1", deployment="d0", ordinal=1, node="b", gpus=[nodes[1].gpus[0].pci],
                        created_at=1.0)]
    profile = InferenceProfile(name="p", gpu=GpuRequest(count=1, vram_gib=8), cpu=1, memory_gib=4)
    reservations = {r.node: set(r.gpus) for r in replicas}
    committed = committed_resources(replicas, deps, {"held": HELD})
    holders = holders_from(replicas, deps, lambda r: HELD)
    got = fit(profile, nodes, reservations, committed, NOW, SchedulerSettings(), holders)
    rows = {r["node"]: r for r in got["nodes"]}
    assert [(n, rows[n]["fits"], rows[n]["with_preemption"]) for n in ("a", "b")] == [
        ("a", 0, {"standard": 2, "critical": 2}), ("b", 0, {"standard": 0, "critical": 0})]
    # the planner agrees: it takes r0 (on a), keeping r1
    index = PlacementIndex(nodes, reservations, NOW, committed=committed)
    crit = InferenceDeployment(name="c", model="m", profile="p", capacity_class="critical")
    model = ModelArtifact(name="m", source="hf://o/m")
    p = plan_preemption(index, crit, profile, model, holders_from(replicas, deps, lambda r: HELD))
    assert (p.outcome, [v.replica_id for v in p.victims], p.node) == ("preempt", ["r0"], "a")
    # and so does the brute-force model of the property test
    assert [r.replica_id for r in removed_for(CLASSES.index("critical"), deps, replicas)] == ["r0"]
