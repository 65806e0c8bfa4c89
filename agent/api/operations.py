"""A long operation's state and result (agent/operations.py holds them in memory).

    GET    /v1/operations/{id}
"""

from __future__ import annotations

from fastapi import APIRouter

from agent.operations import Operations
from agent.state import AgentState
from common.agent_api import AgentOperation
from common.errors import NotFound


def operations_router(state: AgentState, operations: Operations) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/operations/{op_id}", response_model=AgentOperation)
    def get_operation(op_id: str) -> AgentOperation:
        op = operations.get(op_id)
        if op is None:
            raise NotFound(f"no operation {op_id} on node {state.node_id} (finished long ago, or the agent restarted)")
        return op

    return router
