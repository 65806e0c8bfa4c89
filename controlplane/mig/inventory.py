"""MIG slices as the scheduler sees them: a node's GPU list with each sliced parent marked in MIG
mode (so no whole-GPU replica lands on it while slices exist) and one entry per slice (its id
as the address, its memory, `mig_profile` set). A profile asking for `gpu.mig_profile` is placed
only on such entries, and any other profile never is (controlplane.placement.scheduler)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from common.mig_catalog import MigSlice
from common.schemas import GpuInfo, Node


def slice_gpu(parent: GpuInfo, s: MigSlice) -> GpuInfo:
    return parent.model_copy(update={
        "pci": s.id, "uuid": f"{parent.uuid}/mig/{s.profile}/{s.index}", "name": f"{parent.name} MIG {s.profile}",
        "memory_total_mib": s.memory_gib * 1024, "memory_used_mib": 0, "mig_mode": False,
        "mig_profile": s.profile, "mig_parent": parent.pci,
    })


def with_slices(node: Node, slices: Iterable[MigSlice]) -> Node:
    mine = [s for s in slices if s.node == node.id]
    if not mine:
        return node
    parents = {s.parent_bdf for s in mine}
    gpus = [g.model_copy(update={"mig_mode": True}) if g.pci in parents else g for g in node.gpus]
    by_pci = {g.pci: g for g in node.gpus}
    gpus += [slice_gpu(by_pci[s.parent_bdf], s) for s in sorted(mine, key=lambda s: s.id) if s.parent_bdf in by_pci]
    return node.model_copy(update={"gpus": gpus})


def nodes_with_slices(nodes: Mapping[str, Node], slices: list[MigSlice]) -> dict[str, Node]:
    return {nid: with_slices(n, slices) for nid, n in nodes.items()}
