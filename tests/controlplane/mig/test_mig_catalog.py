"""MIG slices, pure: the catalog and fit, how a slice is made per node kind, and placement on
slices (the parent unschedulable while slices exist)."""

from __future__ import annotations

import pytest

from common.errors import Conflict, InvalidInput, NotFound, Refused
from common.schemas import DeploymentStatus, GpuRequest, InferenceDeployment, InferenceProfile, ModelArtifact
from controlplane.mig.catalog import MigSettings, check_delete, mode_for, plan_create
from controlplane.mig.inventory import with_slices
from controlplane.placement.index import place
from controlplane.placement.scheduler import SchedulerSettings
from controlplane.settings import load
from tests.controlplane.planner_data import NOW, node

LAB = node("n1", 2).model_copy(update={"vm_driver": "lab"})
PCI = node("n1", 2).model_copy(update={"vm_driver": "libvirt"})
PARENT = LAB.gpus[0].pci


def make(n, profile, existing=(), settings=MigSettings()):
    return plan_create(n, n.gpus[0].pci, profile, list(existing), settings, NOW)


def test_aliases_and_indexes():
    first = make(LAB, "1g")
    assert (first.profile, first.id, first.memory_gib, first.mode) == ("1g.10gb", f"{PARENT}--1g.10gb--0", 10,
                                                                       "record")
    second = make(LAB, "1g.10gb", [first])
    assert second.id == f"{PARENT}--1g.10gb--1"


def test_slices_must_fit_the_parent():
    big = make(LAB, "7g.80gb")
    with pytest.raises(Conflict, match="does not fit"):
        make(LAB, "1g", [big])
    with pytest.raises(Conflict, match="at most 1"):
        make(LAB, "7g", [big])
    three = make(LAB, "3g.40gb")
    assert make(LAB, "3g", [three]).index == 1
    small = LAB.model_copy(update={"gpus": [LAB.gpus[0].model_copy(update={"memory_total_mib": 40 * 1024})]})
    with pytest.raises(Conflict, match="of 40 GiB"):
        make(small, "3g.40gb", [make(small, "1g")])


def test_bad_profile_and_parent():
    with pytest.raises(InvalidInput, match="H100 catalog"):
        make(LAB, "4g.40gb")
    with pytest.raises(NotFound, match="no GPU"):
        plan_create(LAB, "0000:ff:00.0", "1g", [], MigSettings(), NOW)


def test_mode_per_node_kind_and_flags():
    assert mode_for(LAB, MigSettings()) == "record"
    with pytest.raises(Refused, match="FABRIC_PCI_MIG=1") as refused:
        mode_for(PCI, MigSettings())
    assert refused.value.status == 400
    assert mode_for(PCI, MigSettings(pci_mig=True, record_only=True)) == "record"
    assert mode_for(PCI, MigSettings(pci_mig=True)) == "nvidia-smi"
    assert load({"FABRIC_PCI_MIG": "1", "FABRIC_PCI_MIG_RECORD_ONLY": "1"}).mig == MigSettings(True, True)
    assert load({}).mig == MigSettings()


def test_a_held_slice_cannot_be_deleted():
    s = make(LAB, "1g")
    with pytest.raises(Conflict, match="held by replica r-1"):
        check_delete(s, "r-1")
    check_delete(s, None)


def profile(mig=None, vram=8):
    return InferenceProfile(name="p", gpu=GpuRequest(count=1, vram_gib=vram, mig_profile=mig), cpu=1, memory_gib=1)


def placed(n, prof):
    dep = InferenceDeployment(name="d", model="m", profile="p", status=DeploymentStatus())
    return place(dep, prof, ModelArtifact(name="m", source="hf://a/b"), [n], {}, NOW, SchedulerSettings())


def test_placement_uses_slices_and_never_the_sliced_parent():
    s1, s2 = make(LAB, "1g"), make(LAB, "2g")
    view = with_slices(LAB, [s1, s2])
    assert [g.pci for g in view.gpus if g.mig_mode] == [PARENT]
    assert placed(view, profile("1g.10gb")).gpus == (s1.id,)
    assert placed(view, profile("2g.20gb", vram=16)).gpus == (s2.id,)
    whole = placed(view, profile(None))
    assert whole.gpus == (LAB.gpus[1].pci,)  # the other, unsliced GPU
    assert not placed(with_slices(LAB, [s1]), profile("3g.40gb")).node
    one_gpu = LAB.model_copy(update={"gpus": LAB.gpus[:1]})
    refused = placed(with_slices(one_gpu, [make(one_gpu, "1g")]), profile(None))
    assert refused.node is None and "MIG" in refused.message


def test_a_mig_profile_needs_one_gpu():
    with pytest.raises(ValueError, match="count must be 1"):
        GpuRequest(count=2, vram_gib=10, mig_profile="1g")
    with pytest.raises(ValueError, match="H100 catalog"):
        GpuRequest(count=1, vram_gib=10, mig_profile="5g")
