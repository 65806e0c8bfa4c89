"""The agent's KV-index routes (mounted by agent/api/ when the agent runs a subscriber):

    POST /v1/kv-index/match   {"hashes": [int, ...], "replicas": [id, ...]?}
                              -> {"replicas": {id: {"matched_blocks": n | null, "blind": bool,
                                                    "state": live | warming | blind | unwatched,
                                                    "block_size": the engine's | null,
                                                    "evicting": bool | null}}}
    GET  /v1/kv-index         per replica: blocks held, last seq, gaps, resyncs, restarts, events seen
    GET  /v1/kv-index/tokenizer/{digest}
                              -> {"engine": "vllm" | "sim", "digest": ..., "files": {name: text},
                                  "manifest": the model's manifest text}

``hashes``: the prompt's block hashes in order (64-bit ints, common/kv_events.py), at most
MAX_HASHES; ``matched_blocks`` counts the leading ones the replica holds, null for a replica that
sent no events (the caller falls back to its approximate router for it). ``blind`` is true only
for a replica watched ``blind_after_s`` without one event (``state``, KvEventSubscriber.states):
a fresh engine is ``warming`` until its first call stores a block. ``evicting``: whether the
replica's engine removed a cached block in the last ``evict_window_s`` (common/kv_index.py
KvIndex.evicting: its cache is full), null for a replica that sent no events; the gateway's gate
spreads new conversations onto idle replicas that are not evicting (gateway/router_gate.py).

The tokenizer route hands a gateway the tokenizer files (TOKENIZER_FILES) of a model this node's
cache holds under ``digest`` (the model record's status.digest), so the gateway hashes prompts
with the engine's own tokenizer and chat template, with the manifest stored when the model was
verified (agent/models/cache.py): the gateway checks the files against the digest
(common/model_manifest.verify_served_files), so a node cannot hand it other files. On a node whose engines are simulators
(``simulated``) it answers ``engine: sim`` and no files: the simulator tokenizes its own way
(common/kv_events.sim_token_ids).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter
from pydantic import BaseModel, Field

from common.errors import InvalidInput, NotFound
from common.kv_index import EVICT_WINDOW_S
from common.model_api import DIGEST
from common.model_manifest import TOKENIZER_FILES

MAX_HASHES = 4096  # 64k tokens of prefix at 16-token blocks
MAX_REPLICAS = 1024
MAX_TOKENIZER_BYTES = 64 << 20  # the largest tokenizer.json on the Hub is ~30 MB


class MatchRequest(BaseModel):
    hashes: list[int] = Field(max_length=MAX_HASHES)
    replicas: list[str] | None = Field(default=None, max_length=MAX_REPLICAS)


def tokenizer_files(path: Path) -> dict[str, str]:
    """The tokenizer files of a model directory (plain files only, each under the cap)."""
    out = {}
    for name in TOKENIZER_FILES:
        f = path / name
        try:
            if f.is_file() and not f.is_symlink() and f.stat().st_size <= MAX_TOKENIZER_BYTES:
                out[name] = f.read_text(encoding="utf-8", errors="replace")
        except OSError:  # unreadable: as if absent (a 404 names a missing tokenizer.json)
            continue
    return out


def kv_index_router(subscriber, *, model_dir: Callable[[str], Path | None] | None = None,
                    manifest: Callable[[str], str | None] | None = None, simulated: bool = False, blind_after_s: float = 60.0,
                    evict_window_s: float = EVICT_WINDOW_S) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/kv-index/match")
    def match(body: MatchRequest) -> dict:
        hashes = [h & ((1 << 64) - 1) for h in body.hashes]
        got = subscriber.match(hashes, body.replicas)
        sizes = subscriber.block_sizes(list(got))
        states = subscriber.states(list(got), blind_after_s)
        evicting = subscriber.evicting(list(got), evict_window_s)
        return {"replicas": {r: {"matched_blocks": n, "blind": states[r] == "blind", "state": states[r],
                                 "block_size": sizes.get(r), "evicting": evicting.get(r)} for r, n in got.items()}}

    @router.get("/v1/kv-index")
    def status() -> dict:
        return {"replicas": subscriber.status()}

    @router.get("/v1/kv-index/tokenizer/{digest}")
    def tokenizer(digest: str) -> dict:
        if not DIGEST.match(digest):
            raise InvalidInput(f"digest {digest!r}: expected 64 lowercase hex characters (SHA-256)")
        if simulated:
            return {"engine": "sim", "digest": digest, "files": {}}
        path = model_dir(digest) if model_dir is not None else None
        if path is None:
            raise NotFound(f"model {digest} is not in this node's cache")
        files = tokenizer_files(path)
        if "tokenizer.json" not in files:
            raise NotFound(f"model {digest} has no tokenizer.json on this node")
        text = manifest(digest) if manifest is not None else None
        if text is None:
            raise NotFound(f"model {digest} has no stored manifest on this node")
        return {"engine": "vllm", "digest": digest, "files": files, "manifest": text}

    return router
