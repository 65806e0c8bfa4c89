"""MIG slices on a node's GPUs (controlplane/mig/catalog.py decides; this applies). Admin token.

    GET    /api/ai/nodes/{id}/mig                  the node's slices
    POST   /api/ai/nodes/{id}/mig                  {"parent_bdf", "profile"} -> 201 the slice
    POST   /api/ai/nodes/{id}/gpus/{bdf}/mig       {"profile"} -> the same, parent from the path
    DELETE /api/ai/nodes/{id}/mig/{slice}          409 while a replica holds it

A slice on a simulated node (lab or dry-run driver) is a record. On a real PCI GPU it needs
FABRIC_PCI_MIG=1 on fabricd (else 400); then the node's agent runs `nvidia-smi mig -cgi P -C`
(and destroys the instances on delete) unless FABRIC_PCI_MIG_RECORD_ONLY=1 records it without
the driver. Each change is an operation of controlplane.ops.mig.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from common.records import mig_slices, nodes
from controlplane.api.answers import Deleted
from controlplane.auth import PrincipalDep, require_admin
from controlplane.mig.catalog import MigCreate, MigProfileBody, MigSlice
from controlplane.ops import mig as mig_ops
from controlplane.state import StateDep

router = APIRouter(prefix="/api/ai", tags=["mig"], dependencies=[Depends(require_admin)])


@router.get("/nodes/{node_id}/mig", response_model=list[MigSlice])
def list_slices(node_id: str, state: StateDep) -> list[MigSlice]:
    nodes.require(state.store, node_id)
    return sorted(mig_slices.list(state.store, node_id), key=lambda s: s.id)


@router.post("/nodes/{node_id}/mig", response_model=MigSlice, status_code=201)
async def create_slice(node_id: str, body: MigCreate, state: StateDep, who: PrincipalDep) -> MigSlice:
    return await mig_ops.create(state, who, node_id, body.parent_bdf, body.profile)


@router.post("/nodes/{node_id}/gpus/{bdf}/mig", response_model=MigSlice, status_code=201)
async def create_slice_on_gpu(node_id: str, bdf: str, body: MigProfileBody, state: StateDep,
                              who: PrincipalDep) -> MigSlice:
    return await mig_ops.create(state, who, node_id, bdf, body.profile)


@router.delete("/nodes/{node_id}/mig/{slice_id}", response_model=Deleted)
async def delete_slice(node_id: str, slice_id: str, state: StateDep, who: PrincipalDep) -> dict:
    await mig_ops.delete(state, who, node_id, slice_id)
    return {"kind": "mig", "name": slice_id, "deleted": True}
