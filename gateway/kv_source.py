"""Where a gateway's precise prefix routing reads what the engines hold: the node agents' KV
index (agent/kv_index), one POST /v1/kv-index/match per node that hosts a candidate replica,
concurrently, each bounded by ``timeout_s`` (a node that does not answer in time leaves its
replicas blind for this call: the approximate router scores them). See docs/kv-events.md for
why the gateways ask the agents instead of watching the store.

Tokenizers: ``tokenizer_root/DEPLOYMENT/`` holding the model's tokenizer.json (and
tokenizer_config.json with its chat template) -- the files the supply chain fetched -- gives the
engine's own tokens (gateway/engine_hash.EngineTokenizer); a file ``tokenizer_root/DEPLOYMENT.sim``
marks a deployment of engine simulators (SimTokenizer). Block size: the one the agents report
from the engines' events (``block_size``), learned per deployment; 16 until the first answer.
Node addresses come from the store (keyspace.nodes), cached NODE_TTL_S.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from common import keyspace
from common.kv_events import BlockHasher
from common.schemas import Node
from gateway.engine_hash import EngineTokenizer, RequestHasher, SimTokenizer

NODE_TTL_S = 30.0
DEFAULT_BLOCK_SIZE = 16


class AgentKvSource:
    def __init__(self, store, client, tokenizer_root: Path, timeout_s: float = 0.1) -> None:
        self._store, self._client, self._root, self._timeout = store, client, Path(tokenizer_root), timeout_s
        self._tokenizers: dict[str, object | None] = {}
        self._block_size: dict[str, int] = {}
        self._nodes: dict[str, tuple[float, str | None]] = {}

    def _tokenizer(self, deployment: str):
        if deployment not in self._tokenizers:
            tok = None
            d = self._root / deployment
            if (self._root / f"{deployment}.sim").exists():
                tok = SimTokenizer()
            elif (d / "tokenizer.json").exists():
                try:
                    tok = EngineTokenizer.from_model_dir(d)
                except (OSError, ValueError, Exception):  # a broken file: approximate routing, not a failure
                    tok = None
            self._tokenizers[deployment] = tok
        return self._tokenizers[deployment]

    def hasher(self, view) -> RequestHasher | None:
        deployment = view.endpoint.deployment
        tok = self._tokenizer(deployment)
        if tok is None:
            return None
        return RequestHasher(tok, BlockHasher(self._block_size.get(deployment, DEFAULT_BLOCK_SIZE)))

    def _node_address(self, node_id: str) -> str | None:
        hit = self._nodes.get(node_id)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        kv = self._store.get(keyspace.nodes(node_id))
        address = Node.model_validate_json(kv.value).address if kv is not None else None
        self._nodes[node_id] = (now + NODE_TTL_S, address)
        return address

    async def match(self, view, hashes: list[int]) -> dict[str, int | None]:
        by_node: dict[str, list[str]] = {}
        for r in view.replicas:
            by_node.setdefault(r.node, []).append(r.replica_id)
        out: dict[str, int | None] = {r.replica_id: None for r in view.replicas}

        async def ask(node: str, replicas: list[str]) -> None:
            address = self._node_address(node)
            if address is None:
                return
            try:
                resp = await asyncio.wait_for(self._client.post(
                    f"{address.rstrip('/')}/v1/kv-index/match", json={"hashes": hashes, "replicas": replicas}),
                    self._timeout)
            except (TimeoutError, OSError, Exception):  # transport errors of any client: blind
                return
            if resp.status_code != 200:
                return
            for rid, row in (resp.json().get("replicas") or {}).items():
                if rid in out and isinstance(row, dict):
                    n = row.get("matched_blocks")
                    out[rid] = n if isinstance(n, int) else None
                    size = row.get("block_size")
                    if isinstance(size, int) and size > 0:
                        self._block_size[view.endpoint.deployment] = size

        await asyncio.gather(*(ask(n, rs) for n, rs in by_node.items()))
        return out
