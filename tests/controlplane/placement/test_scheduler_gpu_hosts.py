"""Placement on GPU hosts as they are: IOMMU groups as one unit, lost GPUs, row remapping in
the ECC filter, and HGX boards (NVSwitches) that take 1 GPU or the whole board."""

from controlplane.placement.index import place
from controlplane.placement.scheduler import SchedulerSettings
from tests.controlplane.planner_data import NOW, deployment, gpu, model, node, profile


def grouped(i, group, **kw):
    return gpu(i).model_copy(update={"iommu_group": str(group), **kw})


def run(nodes, count=1, reservations=None, settings=None):
    return place(deployment(), profile(count=count), model(), nodes, reservations or {}, NOW,
                 settings or SchedulerSettings())


def test_two_gpus_of_one_group_never_land_in_two_vms():
    # GPUs 0 and 1 share group 7 (no ACS between them); GPU 0 is already taken.
    n = node("a", gpus=[grouped(0, 7), grouped(1, 7), grouped(2, 8)])
    plan = run([n], reservations={"a": {"0000:10:00.0"}})
    assert plan.node == "a" and plan.gpus == ("0000:12:00.0",)
    full = run([n], reservations={"a": {"0000:10:00.0", "0000:12:00.0"}})
    assert full.node is None and "sharing IOMMU group 7" in full.rejected["a"]


def test_a_replica_takes_whole_groups_adding_up_exactly():
    n = node("a", gpus=[grouped(0, 7), grouped(1, 7), grouped(2, 8), grouped(3, 9)])
    assert run([n], count=2).gpus == ("0000:10:00.0", "0000:11:00.0")  # group 7 whole
    assert run([n], count=1).gpus == ("0000:12:00.0",)  # a singleton, not half of group 7
    odd = node("b", gpus=[grouped(0, 7), grouped(1, 7)])
    plan = run([odd], count=1)
    assert plan.node is None and "no whole IOMMU groups add up to 1" in plan.rejected["b"]


def test_lost_gpu_is_skipped_and_named():
    n = node("a", gpus=[gpu(0).model_copy(update={"state": "lost"}), gpu(1)])
    assert run([n]).gpus == ("0000:11:00.0",)
    both = run([n], count=2)
    assert both.node is None and "1 lost" in both.rejected["a"]


def test_row_remapping_is_part_of_the_ecc_filter():
    pending = gpu(0).model_copy(update={"remapped_rows_pending": True})
    failed = gpu(1).model_copy(update={"remapped_rows_failed": True})
    n = node("a", gpus=[pending, failed, gpu(2)])
    strict = run([n], count=2, settings=SchedulerSettings(reject_ecc=True))
    assert strict.node is None
    assert "row remap pending" in strict.rejected["a"] and "row remapping failed" in strict.rejected["a"]
    assert run([n], count=2).node == "a"  # without FABRIC_REJECT_ECC the flags are only reported


def test_hgx_board_takes_one_gpu_or_the_whole_board():
    board = node("a", 8).model_copy(update={"nvswitches": [f"0000:0{i}:00.0" for i in range(5, 9)]})
    assert run([board], count=1).node == "a"
    assert len(run([board], count=8).gpus) == 8
    for count in (2, 4):
        plan = run([board], count=count)
        assert plan.node is None and "HGX board with 4 NVSwitches" in plan.rejected["a"]
    assert run([node("b", 8)], count=4).node == "b"  # PCIe boards take any shape


def test_mig_slices_are_not_tied_to_their_parents_iommu_group():
    from common.schemas import InferenceProfile

    parent = grouped(0, 7, mig_mode=True)
    slices = [parent.model_copy(update={"pci": f"0000:10:00.0--1g.10gb--{i}", "mig_mode": False,
                                        "mig_profile": "1g.10gb", "mig_parent": parent.pci,
                                        "memory_total_mib": 10240}) for i in range(2)]
    n = node("a", gpus=[parent, *slices])
    prof = InferenceProfile.model_validate({**profile().model_dump(), "gpu": {"count": 1, "vram_gib": 8,
                                                                              "mig_profile": "1g.10gb"}})
    plan = place(deployment(), prof, model(), [n], {}, NOW, SchedulerSettings())
    assert plan.gpus == ("0000:10:00.0--1g.10gb--0",), plan.message
