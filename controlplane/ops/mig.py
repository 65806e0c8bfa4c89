"""MIG slice operations on a node's GPUs (controlplane.mig.catalog decides; this applies).

A slice on a simulated node is a record. On a real PCI GPU (FABRIC_PCI_MIG=1) the node's agent
makes the instances first; the slice is then stored with create-if-absent, and if that write
loses a race the instances just made are destroyed again (409 contended). A slice a replica or a
reservation holds is not deleted (409). Each create and delete is an event on the node.
"""

from __future__ import annotations

import time

from common.errors import Contended, NotFound
from common.records import gpu_reservations, mig_slices, nodes, replicas
from controlplane.mig.catalog import MigSlice, check_delete, plan_create
from controlplane.ops import common
from controlplane.state import AppState
from controlplane.tenancy.principal import Principal


async def create(ctx: AppState, caller: Principal | None, node_id: str, parent_bdf: str, profile: str) -> MigSlice:
    node = nodes.require(ctx.store, node_id)
    planned = plan_create(node, parent_bdf, profile, mig_slices.list(ctx.store, node_id), ctx.settings.mig,
                          time.time())
    if planned.mode == "nvidia-smi":
        async with common.agents(ctx) as agents:
            made = await agents.for_node(node).create_mig(parent_bdf, planned.profile)
            planned = planned.model_copy(update={"gpu_instance_id": made["gpu_instance_id"],
                                                 "compute_instance_id": made["compute_instance_id"]})
            if not mig_slices.create(ctx.store, planned):
                await agents.for_node(node).destroy_mig(parent_bdf, planned.gpu_instance_id,
                                                        planned.compute_instance_id)
                raise Contended(f"slice {planned.id} was created meanwhile; try again")
    elif not mig_slices.create(ctx.store, planned):
        raise Contended(f"slice {planned.id} was created meanwhile; try again")
    common.event(ctx, "node", node_id, "mig-created", f"MIG slice {planned.id} ({planned.mode}) on {parent_bdf}")
    return planned


async def delete(ctx: AppState, caller: Principal | None, node_id: str, slice_id: str) -> None:
    found = mig_slices.versioned(ctx.store, node_id, slice_id)
    if found is None:
        raise NotFound(f"MIG slice {slice_id!r} not found on node {node_id!r}")
    slice_, rev = found
    holders = [r.replica_id for r in replicas.list(ctx.store) if r.node == node_id and slice_id in r.gpus]
    check_delete(slice_, holders[0] if holders else gpu_reservations.holder(ctx.store, node_id, slice_id))
    if slice_.mode == "nvidia-smi" and slice_.gpu_instance_id is not None:
        async with common.agents(ctx) as agents:
            await agents.for_node(nodes.require(ctx.store, node_id)).destroy_mig(
                slice_.parent_bdf, slice_.gpu_instance_id, slice_.compute_instance_id or 0)
    if not mig_slices.discard(ctx.store, node_id, slice_id, mod_revision=rev):
        raise Contended(f"MIG slice {slice_id} changed meanwhile; try again")
    common.event(ctx, "node", node_id, "mig-deleted", f"MIG slice {slice_id} deleted")
