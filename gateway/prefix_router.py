"""The approximate prefix tree behind an endpoint's ``routing_l7: prefix`` (pure): what each
replica was sent, as the gateway remembers it.

The rendered chat prompt (role tags plus contents, as a chat template lays it out) is cut into
chunks of CHUNK_CHARS characters (about 16 tokens: one engine KV block); each chunk is named by a
hash chained over every chunk before it and the call's cache salt (gateway.cache_salt: keyed per
tenant), so one hash names one whole prefix of one tenant -- a chunk-hash trie whose edges are
implicit, in which a tenant only ever matches its own prompts, and an explanation's
``matched_chunks`` and ``hits`` count only the caller's tenant's calls. Each node keeps, per
replica, how many requests it sent there (hits). The tree is bounded (max_nodes, least recently
used dropped first; a lookup touches a path leaf-first, so ancestors outlive their descendants)
and so is each node (max_replicas_per_node, the fewest hits dropped).

The choice itself is the saturation gate's (gateway/router_gate.choose_gated, called by
gateway/replica_router.py): a replica's matched chunks are its matched tokens there, when the
agents' KV index has no answer for it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from common.prompt_chunks import chained_chunk_hashes

CHUNK_CHARS = 64
MAX_CHUNKS = 256  # ~4k tokens of prefix considered; bounds the cost per call


def render_prompt(data: dict) -> str:
    """The prompt as the engine's chat template would lay it out (role tags plus contents)."""
    msgs = data.get("messages")
    if isinstance(msgs, list):
        return "".join(f"<|{m.get('role', '')}|>{_text(m.get('content'))}\n" for m in msgs if isinstance(m, dict))
    return _text(data.get("prompt", data.get("input", "")))


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v.get("text", "") if isinstance(v, dict) else v) for v in value)
    return ""


def chunk_hashes(text: str, chunk_chars: int = CHUNK_CHARS, max_chunks: int = MAX_CHUNKS,
                 salt: str | None = None) -> list[bytes]:
    """Chained hashes of the prompt's full chunks (a partial last chunk is never cached by an
    engine), started from the call's cache salt: one tenant's prefixes never match another's."""
    return chained_chunk_hashes(text, chunk_chars, max_chunks, salt)


def deepest(matched: dict[str, tuple[int, int]]) -> str | None:
    """The replica ``PrefixTree.match`` says was sent the most of a prompt's prefix (its deepest
    chunk, then the most hits on that chunk); None when none was, or when two tie."""
    ranked = sorted(matched.items(), key=lambda kv: kv[1], reverse=True)
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


@dataclass
class PrefixTree:
    max_nodes: int = 100_000
    max_replicas_per_node: int = 4
    _nodes: OrderedDict[bytes, dict[str, int]] = field(default_factory=OrderedDict)

    def match(self, hashes: list[bytes]) -> dict[str, tuple[int, int]]:
        """replica -> (chunks of this prompt it served as a prefix, its hits on the deepest one)."""
        out: dict[str, tuple[int, int]] = {}
        for depth, h in enumerate(hashes, 1):
            node = self._nodes.get(h)
            if node is None:
                break
            for replica, hits in node.items():
                out[replica] = (depth, hits)
        return out

    def record(self, hashes: list[bytes], replica: str) -> None:
        for h in hashes:
            node = self._nodes.get(h)
            if node is None:
                node = self._nodes[h] = {}
            node[replica] = node.get(replica, 0) + 1
            if len(node) > self.max_replicas_per_node:
                del node[min((r for r in node if r != replica), key=lambda r: node[r])]
        for h in reversed(hashes):  # leaf first: ancestors are the most recently used
            self._nodes.move_to_end(h)
        while len(self._nodes) > self.max_nodes:
            self._nodes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._nodes)
