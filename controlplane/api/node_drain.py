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
as they are. Uncordon reopens the node; nothing moves back by itself. Both are operations of
controlplane.ops.drain, which drains a replica the same way for a deployment's drain.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import AliasChoices, BaseModel, Field

from common.schemas import Spec
from controlplane.api.nodes import NodeView, node_view
from controlplane.auth import PrincipalDep, require_admin
from controlplane.ops import drain as drain_ops
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


@router.post("/nodes/{node_id}/drain", status_code=202, response_model=NodeDrained)
def drain_node(node_id: str, body: NodeDrainRequest, state: StateDep, who: PrincipalDep) -> NodeDrained:
    node, drained = drain_ops.drain_node(state, who, node_id, body.grace_secs, body.reason)
    return NodeDrained(node=node.id, cordoned=node.cordoned, drained=drained.replicas,
                       delete_after=drained.delete_after)


@router.post("/nodes/{node_id}/uncordon", response_model=NodeView)
def uncordon_node(node_id: str, state: StateDep, who: PrincipalDep) -> NodeView:
    return node_view(drain_ops.uncordon_node(state, who, node_id), time.time())
