"""The agent's BGP view (FABRIC_BGP=1; agent/bgp does the work).

    GET    /v1/bgp    VIPs announced and why, BGP sessions, recent events
"""

from __future__ import annotations

from fastapi import APIRouter

from agent.state import AgentState
from common.errors import NotFound


def bgp_router(state: AgentState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/bgp")
    def bgp_status() -> dict:
        """What this node announces and why, its BGP sessions, and recent events."""
        if state.bgp is None:
            raise NotFound(f"BGP is off on node {state.node_id} (FABRIC_BGP=1 turns it on)")
        return state.bgp.status()

    return router
