"""The preemption planner, table by table: who is taken, the floor kept, no preemption that makes
no room, ties, sites and MIG slices (controlplane/placement/preemption.py)."""

from __future__ import annotations

from common.schemas import (
    AutoscalingSpec,
    GpuInfo,
    GpuRequest,
    InferenceDeployment,
    InferenceProfile,
    ModelArtifact,
    Replica,
)
from controlplane.placement.index import PlacementIndex
from controlplane.placement.preemption import holders_from, plan_preemption
from controlplane.placement.scheduler import committed_resources
from tests.controlplane.planner_data import NOW, gpu, node

P1 = InferenceProfile(name="p1", gpu=GpuRequest(count=1, vram_gib=24), cpu=4, memory_gib=16)
P2 = InferenceProfile(name="p2", gpu=GpuRequest(count=2, vram_gib=24), cpu=4, memory_gib=16)
MIG1 = InferenceProfile(name="mig1", gpu=GpuRequest(count=1, vram_gib=8, mig_profile="1g.10gb"), cpu=2,
                        memory_gib=8)
MIG3 = InferenceProfile(name="mig3", gpu=GpuRequest(count=1, vram_gib=8, mig_profile="3g.40gb"), cpu=2,
                        memory_gib=8)
PROFILES = {p.name: p for p in (P1, P2, MIG1, MIG3)}
MODEL = ModelArtifact(name="m", source="hf://o/m")


def dep(name, cls="standard", profile="p1", floor=None, **kw):
    auto = AutoscalingSpec(min_replicas=floor, max_replicas=max(floor, 4)) if floor is not None else None
    return InferenceDeployment(name=name, model="m", profile=profile, capacity_class=cls, autoscaling=auto, **kw)


def rep(rid, deployment, nid, gpus, *, age=100.0, draining=False):
    return Replica(replica_id=rid, deployment=deployment, ordinal=0, node=nid, gpus=list(gpus),
                   created_at=NOW - age, draining=draining, phase="Draining" if draining else "Ready")


def pci(i):
    return f"0000:{0x10 + i:02x}:00.0"


def plan(nodes, deployments, replicas, who, *, own=(), guaranteed=None, cross_tenant=()):
    deps = {d.name: d for d in deployments}
    reservations: dict[str, set[str]] = {}
    for r in replicas:
        reservations.setdefault(r.node, set()).update(r.gpus)
    committed = committed_resources(replicas, deps, PROFILES)
    index = PlacementIndex(nodes, reservations, NOW, committed=committed)
    holders = holders_from(replicas, deps, lambda r: PROFILES[deps[r.deployment].profile], guaranteed, cross_tenant)
    d = deps[who]
    return plan_preemption(index, d, PROFILES[d.profile], MODEL, holders, replicas=list(own))


def victims(p):
    return [v.replica_id for v in p.victims]


def test_takes_the_lowest_class_first():
    p = plan([node("a", 2)], [dep("crit", "critical"), dep("std"), dep("opp", "opportunistic")],
             [rep("s-1", "std", "a", [pci(0)], age=10), rep("o-1", "opp", "a", [pci(1)], age=500)],
             "crit")
    assert (p.outcome, victims(p), p.node, p.gpus) == ("preempt", ["o-1"], "a", (pci(1),))


def test_fits_without_preemption_takes_nothing():
    p = plan([node("a", 2)], [dep("crit", "critical"), dep("opp", "opportunistic")],
             [rep("o-1", "opp", "a", [pci(0)])], "crit")
    assert (p.outcome, victims(p), p.gpus) == ("fits", [], (pci(1),))


def test_the_fewest_victims_before_the_lowest_class():
    # Node a: two young opportunistic 1-GPU replicas; node b: one standard 2-GPU replica.
    p = plan([node("a", 2), node("b", 2)],
             [dep("crit", "critical", profile="p2"), dep("opp", "opportunistic"), dep("std", profile="p2")],
             [rep("o-1", "opp", "a", [pci(0)], age=1), rep("o-2", "opp", "a", [pci(1)], age=2),
              rep("s-1", "std", "b", [pci(0), pci(1)], age=900)], "crit")
    assert (victims(p), p.node) == (["s-1"], "b")


def test_several_victims_on_one_node_when_one_is_not_enough():
    p = plan([node("a", 2), node("b", 2)],
             [dep("crit", "critical", profile="p2"), dep("opp", "opportunistic")],
             [rep("o-1", "opp", "a", [pci(0)], age=1), rep("o-2", "opp", "a", [pci(1)], age=2),
              rep("o-3", "opp", "b", [pci(0)], age=3), rep("o-4", "opp", "b", [pci(1)], age=4)], "crit")
    assert (p.outcome, sorted(victims(p)), p.node) == ("preempt", ["o-1", "o-2"], "a")


def test_the_youngest_first_and_ties_on_replica_id():
    deps = [dep("crit", "critical"), dep("opp", "opportunistic")]
    p = plan([node("a", 1), node("b", 1)], deps,
             [rep("o-old", "opp", "a", [pci(0)], age=900), rep("o-new", "opp", "b", [pci(0)], age=5)], "crit")
    assert victims(p) == ["o-new"]
    p = plan([node("a", 1), node("b", 1)], deps,
             [rep("o-b", "opp", "a", [pci(0)], age=5), rep("o-a", "opp", "b", [pci(0)], age=5)], "crit")
    assert (victims(p), p.node) == (["o-a"], "b")


def test_the_floor_is_kept():
    nodes = [node("a", 2)]
    replicas = [rep("o-1", "opp", "a", [pci(0)]), rep("o-2", "opp", "a", [pci(1)])]
    kept = plan(nodes, [dep("crit", "critical"), dep("opp", "opportunistic", floor=2)], replicas, "crit")
    assert (kept.outcome, victims(kept)) == ("nothing", [])
    taken = plan(nodes, [dep("crit", "critical"), dep("opp", "opportunistic", floor=1)], replicas, "crit")
    assert victims(taken) == ["o-1"] or victims(taken) == ["o-2"]
    assert len(victims(taken)) == 1
    # A 2-GPU critical replica would need both: the floor of 1 forbids it.
    none = plan(nodes, [dep("crit", "critical", profile="p2"), dep("opp", "opportunistic", floor=1)], replicas,
                "crit")
    assert none.outcome == "nothing"


def test_only_strictly_lower_classes():
    nodes = [node("a", 1)]
    std = [rep("s-1", "std", "a", [pci(0)])]
    assert plan(nodes, [dep("std2"), dep("std")], std, "std2").outcome == "nothing"
    assert plan(nodes, [dep("crit", "critical"), dep("std")], std, "crit").outcome == "preempt"
    crit = [rep("c-1", "crit", "a", [pci(0)])]
    assert plan(nodes, [dep("crit2", "critical"), dep("crit", "critical")], crit, "crit2").outcome == "nothing"
    opp = [rep("o-1", "opp", "a", [pci(0)])]
    assert plan(nodes, [dep("opp2", "opportunistic"), dep("opp", "opportunistic")], opp, "opp2").outcome == "nothing"
    assert victims(plan(nodes, [dep("std"), dep("opp", "opportunistic")], opp, "std")) == ["o-1"]


def test_no_preemption_that_makes_no_room():
    # The victim holds a GPU too small for the critical profile.
    small = node("a", gpus=[gpu(0, mib=16384)])
    p = plan([small], [dep("crit", "critical"), dep("opp", "opportunistic")],
             [rep("o-1", "opp", "a", [pci(0)])], "crit")
    assert (p.outcome, victims(p)) == ("nothing", [])
    # Taking the replica frees its GPU but the node has no CPU for the critical one.
    tight = node("b", 1, cpu=4)
    p = plan([tight], [dep("crit", "critical", profile="p2"), dep("opp", "opportunistic")],
             [rep("o-1", "opp", "b", [pci(0)])], "crit")
    assert p.outcome == "nothing"


def test_site_rules_hold():
    nodes = [node("a", 1, site="eu"), node("b", 1, site="us")]
    replicas = [rep("o-eu", "opp", "a", [pci(0)], age=900), rep("o-us", "opp", "b", [pci(0)], age=1)]
    p = plan(nodes, [dep("crit", "critical", allowed_sites=["eu"]), dep("opp", "opportunistic")], replicas, "crit")
    assert (victims(p), p.node) == (["o-eu"], "a")  # the younger one is on a site it may not use
    p = plan(nodes, [dep("crit", "critical", allowed_sites=["in"]), dep("opp", "opportunistic")], replicas, "crit")
    assert p.outcome == "nothing"


def slices(nid):
    parent = GpuInfo(index=0, uuid="g", name="NVIDIA A100", pci=pci(0), memory_total_mib=81920, mig_mode=True)
    out = [parent]
    for i, prof in enumerate(["1g.10gb", "1g.10gb", "3g.40gb"]):
        out.append(GpuInfo(index=0, uuid=f"s{i}", name="NVIDIA A100", pci=f"mig-{nid}-{i}",
                           memory_total_mib=10240 if prof == "1g.10gb" else 40960, mig_profile=prof,
                           mig_parent=pci(0)))
    return node(nid, gpus=out)


def test_mig_slices_of_the_wanted_profile_only():
    nodes = [slices("a")]
    replicas = [rep("o-big", "opp3", "a", ["mig-a-2"], age=1), rep("o-s0", "opp", "a", ["mig-a-0"], age=50),
                rep("o-s1", "opp", "a", ["mig-a-1"], age=60)]
    deps = [dep("crit", "critical", profile="mig1"), dep("opp", "opportunistic", profile="mig1"),
            dep("opp3", "opportunistic", profile="mig3")]
    p = plan(nodes, deps, replicas, "crit")
    # o-big is the youngest but holds a 3g slice: taking it makes no room for a 1g replica.
    assert (victims(p), p.gpus) == (["o-s0"], ("mig-a-0",))


def test_draining_room_is_waited_for_not_taken_again():
    nodes = [node("a", 1), node("b", 1)]
    replicas = [rep("o-1", "opp", "a", [pci(0)], draining=True), rep("o-2", "opp", "b", [pci(0)], age=1)]
    p = plan(nodes, [dep("crit", "critical"), dep("opp", "opportunistic")], replicas, "crit")
    assert (p.outcome, p.waiting_on, victims(p), p.node) == ("waiting", ("o-1",), [], "a")


def test_opportunistic_never_preempts():
    p = plan([node("a", 1)], [dep("opp2", "opportunistic"), dep("std")], [rep("s-1", "std", "a", [pci(0)])], "opp2")
    assert p.outcome == "nothing" and "opportunistic" in p.message


def test_a_tenants_guaranteed_gpus_are_never_taken_whatever_the_class():
    deployments = [dep("crit", "critical"), dep("opp-a", "opportunistic", tenant="acme"),
                   dep("opp-b", "opportunistic", tenant="bolt")]
    replicas = [rep("a-1", "opp-a", "a", [pci(0)], age=1), rep("b-1", "opp-b", "n2", [pci(0)], age=900)]
    nodes = [node("a", 1), node("n2", 1)]
    # Without guarantees the youngest opportunistic replica goes (acme's).
    assert victims(plan(nodes, deployments, replicas, "crit")) == ["a-1"]
    # acme is guaranteed its one GPU: bolt's replica is taken instead.
    assert victims(plan(nodes, deployments, replicas, "crit", guaranteed={"acme": 1})) == ["b-1"]
    # Both guaranteed: nothing is taken, and the message says nothing makes room.
    p = plan(nodes, deployments, replicas, "crit", guaranteed={"acme": 1, "bolt": 1})
    assert (p.outcome, victims(p)) == ("nothing", [])


def test_a_guarantee_counts_the_tenants_gpus_over_all_its_replicas():
    # acme holds 2 GPUs on node a (two replicas) and is guaranteed 1: one may go, never both, so a
    # 2-GPU critical replica finds no room on a.
    deployments = [dep("crit", "critical", profile="p2"), dep("opp-a", "opportunistic", tenant="acme")]
    replicas = [rep("a-1", "opp-a", "a", [pci(0)], age=1), rep("a-2", "opp-a", "a", [pci(1)], age=2)]
    assert victims(plan([node("a", 2)], deployments, replicas, "crit")) == ["a-1", "a-2"]
    p = plan([node("a", 2)], deployments, replicas, "crit", guaranteed={"acme": 1})
    assert (p.outcome, victims(p)) == ("nothing", [])
