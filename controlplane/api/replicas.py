"""Replicas as operators see them, and their engine logs. Admin only.

    GET /api/ai/replicas[?deployment=D]          every replica (of D), with drain_left_s while draining
    GET /api/ai/replicas/{id}                    one replica
    GET /api/ai/replicas/{id}/logs?offset=&limit=
                                                 a chunk of its engine log, fetched from the agent of
                                                 its node (lab/dry-run: the engine's output; libvirt:
                                                 the guest's serial console); a negative offset
                                                 counts from the end; follow with next_offset
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Query

from common.errors import NotFound
from common.records import nodes, replicas
from common.schemas import Replica
from controlplane.agent_client import AgentClients
from controlplane.api.answers import LogChunk, ReplicaView
from controlplane.auth import require_admin
from controlplane.state import AppState, StateDep

router = APIRouter(prefix="/api/ai", tags=["replicas"], dependencies=[Depends(require_admin)])
MAX_LOG_CHUNK = 1 << 20


def replica_view(rep: Replica, now: float) -> dict:
    """The record plus drain_left_s: seconds of grace left while draining (None otherwise)."""
    view = rep.model_dump(mode="json")
    view["drain_left_s"] = (round(max(0.0, rep.drain_deadline - now), 1)
                            if rep.draining and rep.drain_deadline else None)
    return view


def _all(state: AppState, deployment: str | None) -> list[Replica]:
    return replicas.list(state.store, deployment)


def _find(state: AppState, replica_id: str) -> Replica:
    for rep in _all(state, None):
        if rep.replica_id == replica_id:
            return rep
    raise NotFound(f"replica {replica_id!r} not found; see `fabricctl ai replica list`")


@router.get("/replicas", response_model=list[ReplicaView])
def list_replicas(state: StateDep, deployment: str | None = None) -> list[dict]:
    now = time.time()
    return [replica_view(r, now) for r in sorted(_all(state, deployment), key=lambda r: (r.deployment, r.ordinal))]


@router.get("/replicas/{replica_id}", response_model=ReplicaView)
def get_replica(replica_id: str, state: StateDep) -> dict:
    return replica_view(_find(state, replica_id), time.time())


@router.get("/replicas/{replica_id}/logs", response_model=LogChunk)
async def replica_logs(replica_id: str, state: StateDep, offset: int = Query(-65536),
                       limit: int = Query(65536, ge=1, le=MAX_LOG_CHUNK)) -> dict:
    rep = _find(state, replica_id)
    node = nodes.get(state.store, rep.node)
    if node is None:
        raise NotFound(f"node {rep.node!r} of replica {replica_id} is not registered")
    async with AgentClients(state.state_dir, insecure=state.settings.insecure).for_node(node) as agent:
        chunk = await agent.vm_logs(rep.vm_id or rep.replica_id, offset, limit)
    return {"replica_id": rep.replica_id, "node": rep.node, **chunk}
