"""Node drain: close a node to new replicas and move every replica off it the way every removal goes.

  POST /api/ai/nodes/{node_id}/drain     {"grace_secs": 30, "reason": "kernel upgrade"} ("grace_seconds" too)
       -> 202 {"node", "cordoned", "drained": [replica ids], "delete_after"}
  POST /api/ai/nodes/{node_id}/uncordon  -> 200 the node as GET /api/ai/nodes/{id} shows it

Drain sets the node's ``cordoned`` reason (fabricd's field: a heartbeat never clears it), so the
scheduler, capacity and the placement index give it nothing new (explain placement says
"cordoned: <reason>"), then drains each of its replicas as `deployments/{name}/drain {"replica": ID}`
does: weight 0 in Maglev with its established flows kept, the gateway stops choosing it, deleted
once its engine reports nothing running or the grace ends. The deployments keep their replica
counts, so the reconciler places a replacement for each on another node (the replacement is
placed while the old one drains). A second drain is harmless: replicas already draining are left
as they are. Uncordon reopens the node; nothing moves back by itself.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import AliasChoices, BaseModel, Field

from common.errors import NotFound
from common.schemas import Node, Spec
from controlplane.api.nodes import NodeView, node_view
from controlplane.auth import require_admin
from controlplane.events import record_event
from controlplane.records import nodes as node_records
from controlplane.records import replicas as replica_records
from controlplane.state import AppState, get_state

router = APIRouter(prefix="/api/ai", tags=["nodes"], dependencies=[Depends(require_admin)])
StateDep = Annotated[AppState, Depends(get_state)]


class NodeDrainRequest(Spec):
    grace_secs: float = Field(30.0, ge=0, le=86400, description="seconds each replica may finish its work at "
                              "weight 0 before deletion (grace_seconds is accepted too)",
                              validation_alias=AliasChoices("grace_secs", "grace_seconds"))
    reason: str = Field("drained by an admin", min_length=1, max_length=200,
                        description="why, shown on the node and in explain placement")


class NodeDrained(BaseModel):
    node: str
    cordoned: str
    drained: list[str] = Field(description="replicas this call started draining (already draining ones not listed)")
    delete_after: float = Field(description="unix time the last of them is deleted at the latest")


def _event(state: AppState, node_id: str, action: str, message: str) -> None:
    record_event(state.store, "node", node_id, action, message, keep=state.settings.events_kept,
                 max_age_s=state.settings.events_max_age_s)


@router.post("/nodes/{node_id}/drain", status_code=202, response_model=NodeDrained)
def drain_node(node_id: str, body: NodeDrainRequest, state: StateDep) -> NodeDrained:
    store = state.store

    def cordon(node: Node) -> Node:
        node.cordoned = body.reason
        return node

    node = node_records.update(store, node_id, cordon)  # NotFound naming the node when absent
    now = time.time()
    deadline = now + body.grace_secs
    drained = []
    for r in replica_records.list(store):
        if r.node != node_id or r.draining or r.phase == "Deleting":
            continue
        current = replica_records.get(store, r.deployment, r.replica_id)
        if current is None or current.draining:
            continue
        replica_records.put(store, current.model_copy(update={
            "draining": True, "drain_deadline": deadline, "drain_started": now, "phase": "Draining",
            "message": f"node {node_id} drained: {body.reason}, {body.grace_secs:g}s grace"}))
        drained.append(r.replica_id)
    _event(state, node_id, "NodeDrained",
           f"node {node_id} cordoned ({body.reason}); {len(drained)} replicas draining, {body.grace_secs:g}s grace")
    return NodeDrained(node=node.id, cordoned=node.cordoned, drained=sorted(drained), delete_after=deadline)


@router.post("/nodes/{node_id}/uncordon", response_model=NodeView)
def uncordon_node(node_id: str, state: StateDep) -> NodeView:
    if node_records.get(state.store, node_id) is None:
        raise NotFound(f"node {node_id!r} not found")

    def reopen(node: Node) -> Node | None:
        if not node.cordoned:
            return None  # already open: nothing written
        node.cordoned = ""
        return node

    node = node_records.update(state.store, node_id, reopen)
    _event(state, node_id, "NodeUncordoned", f"node {node_id} takes new replicas again")
    return node_view(node, time.time())
