"""MIG slices on a node's GPUs (controlplane/mig/catalog.py decides; this applies). Admin token.

    GET    /api/ai/nodes/{id}/mig                  the node's slices
    POST   /api/ai/nodes/{id}/mig                  {"parent_bdf", "profile"} -> 201 the slice
    POST   /api/ai/nodes/{id}/gpus/{bdf}/mig       {"profile"} -> the same, parent from the path
    DELETE /api/ai/nodes/{id}/mig/{slice}          409 while a replica holds it

A slice on a simulated node (lab or dry-run driver) is a record. On a real PCI GPU it needs
FABRIC_PCI_MIG=1 on fabricd (else 400); then the node's agent runs `nvidia-smi mig -cgi P -C`
(and destroys the instances on delete) unless FABRIC_PCI_MIG_RECORD_ONLY=1 records it without
the driver. The slice is stored with create-if-absent after the agent made it; if that store
write loses a race the instances just made are destroyed again.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends

from common.errors import Conflict, NotFound
from common.records import gpu_reservations, mig_slices, nodes, replicas
from common.schemas import Node
from controlplane.agent_client import AgentClients
from controlplane.api.answers import Deleted
from controlplane.auth import require_admin
from controlplane.events import record_event
from controlplane.mig.catalog import (
    MigCreate,
    MigProfileBody,
    MigSlice,
    check_delete,
    plan_create,
)
from controlplane.settings import of as settings_of
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["mig"], dependencies=[Depends(require_admin)])


def _node(state: AppState, node_id: str) -> Node:
    return nodes.require(state.store, node_id)


def _slices(state: AppState, node_id: str) -> list[MigSlice]:
    return mig_slices.list(state.store, node_id)


def _agents(state: AppState) -> AgentClients:
    return AgentClients(state.state_dir, insecure=state.settings.insecure)


async def _create(state: AppState, node_id: str, parent_bdf: str, profile: str) -> MigSlice:
    node = _node(state, node_id)
    planned = plan_create(node, parent_bdf, profile, _slices(state, node_id), settings_of(state).mig, time.time())
    if planned.mode == "nvidia-smi":
        agents = _agents(state)
        try:
            made = await agents.for_node(node).create_mig(parent_bdf, planned.profile)
            planned = planned.model_copy(update={"gpu_instance_id": made["gpu_instance_id"],
                                                 "compute_instance_id": made["compute_instance_id"]})
            if not mig_slices.create(state.store, planned):
                await agents.for_node(node).destroy_mig(parent_bdf, planned.gpu_instance_id,
                                                        planned.compute_instance_id)
                raise Conflict(f"slice {planned.id} was created meanwhile; try again", code="contended")
        finally:
            await agents.aclose()
    elif not mig_slices.create(state.store, planned):
        raise Conflict(f"slice {planned.id} was created meanwhile; try again", code="contended")
    record_event(state.store, "node", node_id, "mig-created",
                 f"MIG slice {planned.id} ({planned.mode}) on {parent_bdf}", keep=state.settings.events_kept)
    return planned


@router.get("/nodes/{node_id}/mig", response_model=list[MigSlice])
def list_slices(node_id: str, state: StateDep) -> list[MigSlice]:
    _node(state, node_id)
    return sorted(_slices(state, node_id), key=lambda s: s.id)


@router.post("/nodes/{node_id}/mig", response_model=MigSlice, status_code=201)
async def create_slice(node_id: str, body: MigCreate, state: StateDep) -> MigSlice:
    return await _create(state, node_id, body.parent_bdf, body.profile)


@router.post("/nodes/{node_id}/gpus/{bdf}/mig", response_model=MigSlice, status_code=201)
async def create_slice_on_gpu(node_id: str, bdf: str, body: MigProfileBody, state: StateDep) -> MigSlice:
    return await _create(state, node_id, bdf, body.profile)


@router.delete("/nodes/{node_id}/mig/{slice_id}", response_model=Deleted)
async def delete_slice(node_id: str, slice_id: str, state: StateDep) -> dict:
    found = mig_slices.versioned(state.store, node_id, slice_id)
    if found is None:
        raise NotFound(f"MIG slice {slice_id!r} not found on node {node_id!r}")
    slice_, rev = found
    holders = [r.replica_id for r in _replicas_on(state, node_id, slice_id)]
    check_delete(slice_, holders[0] if holders else gpu_reservations.holder(state.store, node_id, slice_id))
    if slice_.mode == "nvidia-smi" and slice_.gpu_instance_id is not None:
        agents = _agents(state)
        try:
            await agents.for_node(_node(state, node_id)).destroy_mig(slice_.parent_bdf, slice_.gpu_instance_id,
                                                                     slice_.compute_instance_id or 0)
        finally:
            await agents.aclose()
    if not mig_slices.discard(state.store, node_id, slice_id, mod_revision=rev):
        raise Conflict(f"MIG slice {slice_id} changed meanwhile; try again", code="contended")
    record_event(state.store, "node", node_id, "mig-deleted", f"MIG slice {slice_id} deleted",
                 keep=state.settings.events_kept)
    return {"kind": "mig", "name": slice_id, "deleted": True}


def _replicas_on(state: AppState, node_id: str, slice_id: str):
    for r in replicas.list(state.store):
        if r.node == node_id and slice_id in r.gpus:
            yield r
