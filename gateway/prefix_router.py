"""Prefix-cache-aware replica choice (an endpoint's ``routing_l7: prefix``), pure.

The rendered chat prompt (role tags plus contents, as a chat template lays it out) is cut into
chunks of CHUNK_CHARS characters (about 16 tokens: one engine KV block); each chunk is named by a
hash chained over every chunk before it and the call's cache salt (gateway.cache_salt: keyed per
tenant), so one hash names one whole prefix of one tenant -- a chunk-hash trie whose edges are
implicit, in which a tenant only ever matches its own prompts, and an explanation's
``matched_chunks`` and ``hits`` count only the caller's tenant's calls. Each node keeps, per replica, how many requests it sent there (hits),
so a prefix that a randomizing picker spread over several replicas still points at the ones that
served it most. The tree is bounded (max_nodes, least recently used dropped first; a lookup
touches a path leaf-first, so ancestors outlive their descendants) and so is each node
(max_replicas_per_node, the fewest hits dropped).

Choice: every ready replica gets a score

    affinity_weight * matched_chunks / prompt_chunks  -  load_weight * (queue + in_flight)

(queue: the last fresh scraped queue depth; in_flight: this gateway's calls in flight to it), so
a long shared prefix wins only while its replica is not much busier: load outvotes affinity.
The imbalance guard then overrides affinity outright when the best-scored replica's load exceeds
the least-loaded one's by BOTH ``abs_gap`` requests AND ``rel_gap`` times: the least-loaded
replica is taken. Ties (a prefix nobody served yet) go to the least-loaded replica, then to the
one the tree names least (so new system prompts spread over the caches), then by rendezvous hash
of the first chunk. The
caller records the replica actually chosen into the tree (``PrefixTree.record``).
"""

from __future__ import annotations

import hashlib
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


@dataclass
class PrefixTree:
    max_nodes: int = 100_000
    max_replicas_per_node: int = 4
    _nodes: OrderedDict[bytes, dict[str, int]] = field(default_factory=OrderedDict)
    _owned: dict[str, int] = field(default_factory=dict)  # replica -> nodes naming it (its cached share)

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
            if replica not in node:
                self._owned[replica] = self._owned.get(replica, 0) + 1
            node[replica] = node.get(replica, 0) + 1
            if len(node) > self.max_replicas_per_node:
                self._drop(node, min((r for r in node if r != replica), key=lambda r: node[r]))
        for h in reversed(hashes):  # leaf first: ancestors are the most recently used
            self._nodes.move_to_end(h)
        while len(self._nodes) > self.max_nodes:
            _, node = self._nodes.popitem(last=False)
            for r in list(node):
                self._drop(node, r)

    def _drop(self, node: dict[str, int], replica: str) -> None:
        del node[replica]
        left = self._owned.get(replica, 0) - 1
        if left > 0:
            self._owned[replica] = left
        else:
            self._owned.pop(replica, None)

    def owned(self, replica: str) -> int:
        """How many prefix nodes name this replica: its share of what the tree remembers."""
        return self._owned.get(replica, 0)

    def __len__(self) -> int:
        return len(self._nodes)


@dataclass(frozen=True)
class PrefixPolicy:
    affinity_weight: float = 1.0
    load_weight: float = 0.1  # one request of load outweighs a tenth of a full prefix match
    abs_gap: float = 4.0
    rel_gap: float = 2.0
    idle_bonus: float = 0.05  # precise: an idle replica (load 0) gets this much, so new ones warm up
    tie_eps: float = 1e-6  # precise: scores this close are a tie, drawn at random


@dataclass(frozen=True)
class Candidate:
    replica: str
    queue: float  # the last fresh scraped queue depth (0 when none)
    in_flight: int  # this gateway's calls to it now
    pending: int = 0  # this gateway's calls chosen for it but not started yet (ReplicaRouter)

    @property
    def load(self) -> float:
        return self.queue + self.in_flight + self.pending


@dataclass(frozen=True)
class Decision:
    chosen: str
    reason: str  # affinity | load | imbalance_guard | hash
    chunks: int
    scores: tuple[dict, ...]

    def explain(self) -> dict:
        return {"chosen": self.chosen, "reason": self.reason, "prompt_chunks": self.chunks,
                "scores": list(self.scores)}


def _tiebreak(first: bytes, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(first + replica.encode(), digest_size=8).digest(), "big")


def imbalanced(load: float, least: float, policy: PrefixPolicy) -> bool:
    """Pure: both gaps are needed -- an absolute one (small counts are noise) and a relative one
    (a few more on a busy replica is no imbalance)."""
    return load - least >= policy.abs_gap and load >= policy.rel_gap * max(least, 1.0)


def choose(candidates: list[Candidate], hashes: list[bytes], tree: PrefixTree,
           policy: PrefixPolicy = PrefixPolicy()) -> Decision:
    """Pure (reads the tree): the replica for a prompt with these chunk hashes."""
    if not candidates:
        raise ValueError("no candidate replica")
    matched = tree.match(hashes)
    n = max(len(hashes), 1)
    first = hashes[0] if hashes else b""
    rows = []
    for c in candidates:
        depth, hits = matched.get(c.replica, (0, 0))
        score = policy.affinity_weight * depth / n - policy.load_weight * c.load
        rows.append((score, hits, -c.load, -tree.owned(c.replica), _tiebreak(first, c.replica), c, depth))
    rows.sort(key=lambda r: r[:5], reverse=True)
    best = rows[0]
    least = min(rows, key=lambda r: (r[5].load, -r[3], -r[4]))
    if best[6] and imbalanced(best[5].load, least[5].load, policy):
        chosen, reason = least[5], "imbalance_guard"
    elif best[6]:
        chosen, reason = best[5], "affinity"
    else:  # no affinity won: load decided, or the replica remembering the least, or the hash
        chosen = best[5]
        reason = "load" if matched or chosen.load < max(r[5].load for r in rows) else "hash"
    # What the tree holds for other salts (its per-replica node counts) stays out of the explanation.
    scores = tuple({"replica": r[5].replica, "score": round(r[0], 4), "matched_chunks": r[6], "hits": r[1],
                    "queue": r[5].queue, "in_flight": r[5].in_flight} for r in rows)
    return Decision(chosen.replica, reason, len(hashes), scores)


def choose_precise(candidates: list[Candidate], matched: dict[str, int | None], n_blocks: int,
                   approx: dict[str, int] | None = None, approx_chunks: int = 0,
                   policy: PrefixPolicy = PrefixPolicy(), rng=None) -> Decision:
    """Pure but for ``rng``: the replica for a prompt of ``n_blocks`` engine blocks, from what the
    engines report they hold (``matched``: replica -> leading blocks of this prompt in its KV
    cache, None for a replica that sent no KV events).

        affinity_weight * matched / n_blocks  -  load_weight * load  (+ idle_bonus when load is 0)

    load = scraped queue + this gateway's calls in flight + its calls chosen but not started, so
    a burst that lands before any call has started still sees its own choices. A blind replica's
    affinity is the approximate router's (``approx``: its matched chunks of ``approx_chunks``).
    The imbalance guard (both gaps) sends the call to the least-loaded replica; scores within
    tie_eps of the best are drawn uniformly (no fixed order to pile onto)."""
    import random as _random

    if not candidates:
        raise ValueError("no candidate replica")
    rng = rng or _random
    rows = []
    for c in candidates:
        got = matched.get(c.replica)
        blind = got is None
        if blind:
            depth = (approx or {}).get(c.replica, 0)
            frac = depth / max(approx_chunks, 1)
        else:
            depth = got
            frac = got / max(n_blocks, 1)
        score = policy.affinity_weight * frac - policy.load_weight * c.load + (policy.idle_bonus if c.load == 0 else 0.0)
        rows.append({"replica": c.replica, "score": score, "matched_blocks": None if blind else depth,
                     "approx_chunks": depth if blind else None, "blind": blind, "load": c.load,
                     "queue": c.queue, "in_flight": c.in_flight, "pending": c.pending, "_c": c, "_frac": frac})
    best_score = max(r["score"] for r in rows)
    tied = [r for r in rows if r["score"] >= best_score - policy.tie_eps]
    best = tied[0] if len(tied) == 1 else rng.choice(tied)
    least_load = min(r["load"] for r in rows)
    if best["_frac"] > 0 and imbalanced(best["load"], least_load, policy):
        pool = [r for r in rows if r["load"] == least_load]
        chosen, reason = rng.choice(pool), "imbalance_guard"
    elif best["_frac"] > 0:
        chosen, reason = best, "blind_approximate" if best["blind"] else "kv_match"
    else:
        chosen, reason = best, "load" if len(tied) < len(rows) else "random_tie"
    rows.sort(key=lambda r: -r["score"])
    scores = tuple({k: (round(v, 4) if k == "score" else v) for k, v in r.items() if not k.startswith("_")}
                   for r in rows)
    return Decision(chosen["replica"], reason, n_blocks, scores)
