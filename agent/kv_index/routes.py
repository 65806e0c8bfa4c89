"""The agent's KV-index routes (mounted by agent/api.py when the agent runs a subscriber):

    POST /v1/kv-index/match   {"hashes": [int, ...], "replicas": [id, ...]?}
                              -> {"replicas": {id: {"matched_blocks": n | null, "blind": bool,
                                                    "block_size": the engine's | null}}}
    GET  /v1/kv-index         per replica: blocks held, last seq, gaps, resyncs, restarts, events seen

``hashes``: the prompt's block hashes in order (64-bit ints, common/kv_events.py), at most
MAX_HASHES; ``matched_blocks`` counts the leading ones the replica holds, null for a replica that
sent no events (the caller falls back to its approximate router for it).
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

MAX_HASHES = 4096  # 64k tokens of prefix at 16-token blocks
MAX_REPLICAS = 1024


class MatchRequest(BaseModel):
    hashes: list[int] = Field(max_length=MAX_HASHES)
    replicas: list[str] | None = Field(default=None, max_length=MAX_REPLICAS)


def kv_index_router(subscriber) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/kv-index/match")
    def match(body: MatchRequest) -> dict:
        hashes = [h & ((1 << 64) - 1) for h in body.hashes]
        got = subscriber.match(hashes, body.replicas)
        sizes = subscriber.block_sizes(list(got))
        return {"replicas": {r: {"matched_blocks": n, "blind": n is None, "block_size": sizes.get(r)}
                             for r, n in got.items()}}

    @router.get("/v1/kv-index")
    def status() -> dict:
        return {"replicas": subscriber.status()}

    return router
