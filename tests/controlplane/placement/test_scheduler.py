"""Placement filters, scores, determinism and rejection reasons (pure, table-driven)."""

import random

import pytest

from common.schemas import InferenceDeployment
from controlplane.placement.index import place
from controlplane.placement.scheduler import Committed, SchedulerSettings, committed_resources
from controlplane.settings import load
from tests.controlplane.planner_data import NOW, deployment, gpu, model, node, profile, replica


def run(nodes, *, dep=None, prof=None, mdl=None, reservations=None, settings=None, **kw):
    return place(dep or deployment(), prof or profile(), mdl or model(), nodes, reservations or {}, NOW,
                 settings or SchedulerSettings(), **kw)


@pytest.mark.parametrize(
    "case, nodes, kwargs, chosen, rejected_words",
    [
        ("offline heartbeat", [node("a", age=61), node("b")], {}, "b", {"a": "offline"}),
        ("tainted", [node("a", taints=["maintenance"]), node("b")], {}, "b", {"a": "tainted: maintenance"}),
        ("too little VRAM", [node("a", gpus=[gpu(0, mib=16384)]), node("b")], {}, "b", {"a": "1 under 24 GiB"}),
        ("unsized GPU", [node("a", gpus=[gpu(0, mib=0, name="NVIDIA [10de:2bad]")]), node("b")], {}, "b",
         {"a": "1 memory unknown (NVIDIA [10de:2bad]: not sized)"}),
        ("gpu model filter", [node("a", gpus=[gpu(0, name="NVIDIA A10")]), node("b")],
         {"prof": profile(model="H100")}, "b", {"a": "not a H100"}),
        ("hot GPU", [node("a", gpus=[gpu(0, temp=91)]), node("b")],
         {"settings": SchedulerSettings(max_gpu_temp_c=85)}, "b", {"a": "hotter than 85"}),
        ("ECC rejected when asked", [node("a", gpus=[gpu(0, ecc=2)]), node("b")],
         {"settings": SchedulerSettings(reject_ecc=True)}, "b", {"a": "ECC"}),
        ("MIG GPU is not whole", [node("a", gpus=[gpu(0, mig=True)]), node("b")], {}, "b", {"a": "MIG"}),
        ("reserved GPUs", [node("a", 1), node("b")], {"reservations": {"a": {"0000:10:00.0"}}}, "b",
         {"a": "1 reserved"}),
        ("group must be on one node", [node("a", 1), node("b", 1)], {"prof": profile(count=2)}, None,
         {"a": "needs 2", "b": "needs 2"}),
        ("cpu", [node("a", cpu=4), node("b")], {}, "b", {"a": "not enough CPU"}),
        ("memory", [node("a", mem=8), node("b")], {}, "b", {"a": "not enough memory"}),
        ("allowed sites", [node("a", site="x"), node("b", site="y")],
         {"dep": deployment(allowed_sites=["y"])}, "b", {"a": "not in allowed sites"}),
        ("residency", [node("a", site="eu"), node("b", site="us")], {"mdl": model(residency="us")}, "b",
         {"a": "residency"}),
        ("excluded", [node("a"), node("b")], {"exclude": {"a"}}, "b", {"a": "excluded"}),
        ("no nodes", [], {}, None, {}),
    ],
)
def test_filters(case, nodes, kwargs, chosen, rejected_words):
    plan = run(nodes, **kwargs)
    assert plan.node == chosen, plan.message
    for nid, words in rejected_words.items():
        assert words in plan.rejected[nid], (case, plan.rejected[nid])
    if chosen is None:
        assert plan.gpus == () and plan.message


@pytest.mark.parametrize(
    "case, nodes, kwargs, chosen",
    [
        ("ties break on node id", [node("b"), node("a")], {}, "a"),
        ("cached model wins", [node("a"), node("b", cached=["qwen"])], {}, "b"),
        ("preferred site wins", [node("a", site="x"), node("b", site="y")],
         {"dep": deployment(preferred_site="y")}, "b"),
        ("cache beats preferred site", [node("a", site="y"), node("b", site="x", cached=["hf://Qwen/Qwen3-8B"])],
         {"dep": deployment(preferred_site="y")}, "b"),
        ("spread across failure domains", [node("a", domain="rack1"), node("b", domain="rack1"),
                                           node("c", domain="rack2")],
         {"replicas": [replica(0, "a")]}, "c"),
        ("spread across nodes in one domain", [node("a", domain="r"), node("b", domain="r")],
         {"replicas": [replica(0, "a")]}, "b"),
    ],
)
def test_scores(case, nodes, kwargs, chosen):
    assert run(nodes, **kwargs).node == chosen, case


def test_gpus_are_chosen_in_pci_order_skipping_reserved():
    plan = run([node("a", 4)], prof=profile(count=2), reservations={"a": {"0000:10:00.0"}})
    assert plan.gpus == ("0000:11:00.0", "0000:12:00.0")


def test_same_inputs_same_plan_in_any_node_order():
    nodes = [node(f"n{i:03d}", 8, domain=f"d{i % 7}", cached=["qwen"] if i % 5 == 0 else []) for i in range(60)]
    first = run(nodes, prof=profile(count=2))
    shuffled = nodes[:]
    random.Random(4).shuffle(shuffled)
    assert run(shuffled, prof=profile(count=2)) == first
    assert first.node == "n000"


def test_settings_from_env():
    s = load({"FABRIC_MAX_GPU_TEMP_C": "80", "FABRIC_REJECT_ECC": "1"}).scheduler
    assert s.max_gpu_temp_c == 80 and s.reject_ecc
    assert load({}).scheduler == SchedulerSettings()


# -- CPU and memory the replicas already on a node hold (all deployments) ------------------------------

DEPLOYMENTS = {"qwen": deployment(), "other": InferenceDeployment(name="other", model="qwen", profile="small"),
               "orphan": InferenceDeployment(name="orphan", model="qwen", profile="gone")}
PROFILES = {"p24": profile(cpu=4, mem=16), "small": profile(cpu=2, mem=8).model_copy(update={"name": "small"})}


def held(nid, dep="qwen", ordinal=0, **kw):
    return replica(ordinal, nid, **kw).model_copy(update={"deployment": dep, "replica_id": f"{dep}-{ordinal}-{nid}"})


@pytest.mark.parametrize(
    "case, nodes, replicas, prof, chosen, reason",
    [
        ("8 CPUs take a first 4-CPU replica", [node("a", 4, cpu=8)], [], profile(cpu=4, mem=1), "a", None),
        ("8 CPUs take a second 4-CPU replica", [node("a", 4, cpu=8)], [held("a")], profile(cpu=4, mem=1), "a",
         None),
        ("8 CPUs refuse a third 4-CPU replica", [node("a", 4, cpu=8)], [held("a"), held("a", ordinal=1)],
         profile(cpu=4, mem=1), None, "not enough CPU: 0 of 8 free after 2 replicas, needs 4"),
        ("replicas of other deployments count", [node("a", 4, cpu=8)],
         [held("a", "other"), held("a", "other", 1), held("a", "other", 2)], profile(cpu=4, mem=1), None,
         "not enough CPU: 2 of 8 free after 3 replicas, needs 4"),
        ("the refused node's replicas go elsewhere", [node("a", 4, cpu=8), node("b", 4, cpu=8)],
         [held("a"), held("a", ordinal=1)], profile(cpu=4, mem=1), "b", None),
        ("memory likewise: 16 of 40 GiB left fits 16", [node("a", 4, mem=40)], [held("a"), held("a", "other", 1)],
         profile(cpu=1, mem=16), "a", None),
        ("memory likewise: 12 of 40 GiB left refuses 20", [node("a", 4, mem=40)],
         [held("a"), held("a", "other", 1)], profile(cpu=1, mem=20), None,
         "not enough memory: 12 of 40 GiB free after 2 replicas, needs 20"),
        ("a draining replica still holds its VM", [node("a", 4, cpu=8)],
         [held("a"), held("a", ordinal=1, draining=True, phase="Draining")], profile(cpu=4, mem=1), None,
         "after 2 replicas"),
        ("a replica being deleted holds until its record goes", [node("a", 4, cpu=8)],
         [held("a"), held("a", ordinal=1, ready=False, phase="Deleting")], profile(cpu=4, mem=1), None,
         "after 2 replicas"),
        ("a deleted replica (record gone) frees its share", [node("a", 4, cpu=8)], [held("a")],
         profile(cpu=4, mem=1), "a", None),
        ("a replica without a profile holds nothing", [node("a", 4, cpu=8)],
         [held("a"), held("a", "orphan", 1)], profile(cpu=4, mem=1), "a", None),
        ("no replicas: the plain reason", [node("a", 4, cpu=2)], [], profile(cpu=4, mem=1), None,
         "not enough CPU: 2 of 2 free, needs 4"),
        ("dry-run nodes fill up like any other", [node("a", 4, cpu=8, driver="dry-run")],
         [held("a"), held("a", ordinal=1)], profile(cpu=4, mem=1), None, "not enough CPU: 0 of 8 free"),
    ],
)
def test_committed_cpu_and_memory(case, nodes, replicas, prof, chosen, reason):
    profiles = {**PROFILES, "p24": prof}
    committed = committed_resources(replicas, DEPLOYMENTS, profiles)
    plan = run(nodes, prof=prof, committed=committed)
    assert plan.node == chosen, (case, plan.message)
    if reason:
        assert reason in plan.rejected["a"], (case, plan.rejected["a"])


def test_committed_resources_sums_per_node():
    replicas = [held("a"), held("a", "other", 1), held("b"), held("b", "orphan", 2)]
    assert committed_resources(replicas, DEPLOYMENTS, PROFILES) == {
        "a": Committed(cpu=6, memory_gib=24, replicas=2), "b": Committed(cpu=4, memory_gib=16, replicas=1)}
    assert committed_resources([], DEPLOYMENTS, PROFILES) == {}


def test_a_node_whose_kvm_does_not_work_takes_no_gpu_replica():
    from common.schemas import KvmStatus

    broken = node("a").model_copy(update={"kvm": KvmStatus(usable=False, reason="failed to set MSR 0x10a")})
    working = node("b").model_copy(update={"kvm": KvmStatus(usable=True, reason="a kvm guest ran")})
    plan = run([broken, working])
    assert plan.node == "b"
    assert "KVM does not work on this node: failed to set MSR 0x10a" in plan.rejected["a"]
    assert run([node("c")]).node == "c"  # a node that reports no verdict (not libvirt) is not filtered
