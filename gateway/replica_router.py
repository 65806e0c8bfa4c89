"""The gateway's own replica choice for endpoints whose ``routing_l7`` is not ``affinity``, and
the explanations of recent choices (GET /api/ai/explain/request/{request_id}).

Precise prefix routing (``routing_l7: prefix`` with a KV-index source, ``kv``): ``apick`` computes
the request's engine block hashes (gateway/engine_hash.py, the source's hasher for the endpoint),
asks the agents' KV index what each replica holds (agent/kv_index) and scores with
prefix_router.choose_precise; a request that cannot be hashed, an index that does not answer,
and replicas that sent no KV events fall back to the approximate tree (the explanation says
which: ``kv_index``, ``blind_replicas``; ``kv_states`` and ``kv_blind`` give each replica's
state in the agents' answer, gateway/kv_blind.py; ``kv_other_model`` the replicas of a revision
with another model than the tokenizer's, gateway/kv_source.py). Calls chosen but not started yet count as load
(``pending``, expiring after PENDING_TTL if a call never starts).

State per gateway process: one PrefixTree per endpoint (at most MAX_ENDPOINTS; a new one past
that replaces the least recently used), this process's calls in flight per replica (the load
signal next to the scraped queue depth, which may be up to MAX_READING_AGE old), a round-robin
counter per endpoint, and the explanations: at most MAX_EXPLANATIONS, each kept EXPLAIN_TTL
seconds, readable only by the credential that made the call (others get the same 404 as an
unknown id, so ids reveal nothing across callers).
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from gateway.prefix_router import (
    Candidate,
    PrefixPolicy,
    PrefixTree,
    choose,
    choose_precise,
    chunk_hashes,
    render_prompt,
)
from gateway.upstreams import MAX_READING_AGE, EndpointView

MAX_ENDPOINTS = 256
MAX_EXPLANATIONS = 10_000
EXPLAIN_TTL = 600.0
PENDING_TTL = 10.0  # a chosen call that has not started by then (refused at admission) stops counting


@dataclass
class ReplicaRouter:
    policy: PrefixPolicy = field(default_factory=PrefixPolicy)
    max_nodes: int = 100_000
    explain_ttl: float = EXPLAIN_TTL  # FABRIC_GATEWAY_EXPLAIN_SECS
    _trees: OrderedDict[str, PrefixTree] = field(default_factory=OrderedDict)
    _in_flight: dict[str, int] = field(default_factory=dict)
    _rr: dict[str, int] = field(default_factory=dict)
    _explained: OrderedDict[str, tuple[float, str, dict]] = field(default_factory=OrderedDict)
    _rng: random.Random = field(default_factory=random.Random)
    kv: object | None = None  # a KV-index source: .hasher(view) -> a hasher (async .hash_request) | None, async .match(view, hashes)
    _pending: dict[str, deque] = field(default_factory=dict)

    def _tree(self, endpoint: str) -> PrefixTree:
        tree = self._trees.get(endpoint)
        if tree is None:
            tree = self._trees[endpoint] = PrefixTree(self.max_nodes)
            while len(self._trees) > MAX_ENDPOINTS:
                self._trees.popitem(last=False)
        self._trees.move_to_end(endpoint)
        return tree

    def candidates(self, view: EndpointView, now: float) -> list[Candidate]:
        out = []
        for r in view.replicas:
            reading = view.queue_depths.get(r.replica_id)
            queue = reading[0] if reading is not None and now - reading[1] < MAX_READING_AGE else 0.0
            out.append(Candidate(r.replica_id, queue, self._in_flight.get(r.replica_id, 0),
                                 self._pending_count(r.replica_id)))
        return out

    def _pending_count(self, replica: str, now: float | None = None) -> int:
        q = self._pending.get(replica)
        if not q:
            return 0
        now = time.monotonic() if now is None else now
        while q and q[0] <= now:
            q.popleft()
        return len(q)

    async def apick(self, view: EndpointView, data: dict | None, now: float) -> tuple[str, dict]:
        """``pick``, with the agents' KV index asked first when the endpoint routes by prefix."""
        kv_note = None
        matched = hashes = None
        if self.kv is not None and data and view.endpoint.routing_l7 == "prefix":
            hasher = await self.kv.hasher(view)
            hashes = await hasher.hash_request(data) if hasher is not None else None
            if hasher is None:
                kv_note = "approximate: no tokenizer for this model"
            elif hashes is None:
                kv_note = "approximate: the request cannot be tokenized here in time"
            else:
                try:
                    matched = await self.kv.match(view, hashes)
                except Exception as exc:  # any transport error: route approximately, say why
                    kv_note = f"approximate: the KV index did not answer ({type(exc).__name__})"
        picked, why = self.pick(view, data, now, matched=matched, block_hashes=hashes, kv_note=kv_note)
        if matched is not None and hasattr(self.kv, "states"):  # live | warming | blind | refused | ...
            states = self.kv.states(view)
            why["kv_states"] = states
            why["kv_blind"] = sorted(r for r, s in states.items() if s == "blind")
            why["kv_other_model"] = sorted(r for r, s in states.items() if s == "other_model")  # mid-rollout
        return picked, why

    def pick(self, view: EndpointView, data: dict | None, now: float, *, matched: dict | None = None,
             block_hashes: list[int] | None = None, kv_note: str | None = None) -> tuple[str, dict]:
        """(replica id, explanation) for a view with at least one replica; ``matched`` (the KV
        index's answer for ``block_hashes``) makes a prefix endpoint's choice precise."""
        mode, name = view.endpoint.routing_l7, view.endpoint.name
        cands = self.candidates(view, now)
        loads = [{"replica": c.replica, "queue": c.queue, "in_flight": c.in_flight} for c in cands]
        if mode == "round_robin":
            i = self._rr.get(name, 0)
            self._rr[name] = i + 1
            return cands[i % len(cands)].replica, {"mode": mode, "reason": "next in turn", "scores": loads}
        if mode == "random":
            return self._rng.choice(cands).replica, {"mode": mode, "reason": "uniform draw", "scores": loads}
        salt = data.get("cache_salt") if data else None  # per tenant (gateway.cache_salt)
        hashes = chunk_hashes(render_prompt(data), salt=salt if isinstance(salt, str) else None) if data else []
        tree = self._tree(name)
        if matched is not None and block_hashes is not None and mode == "prefix":
            approx = {r: d for r, (d, _) in tree.match(hashes).items()}
            decision = choose_precise(cands, matched, len(block_hashes), approx, len(hashes), self.policy, self._rng)
            blind = sorted(r for r, n in matched.items() if n is None)
            extra = {"kv_index": "precise", "blind_replicas": blind, "prompt_blocks": len(block_hashes)}
        else:
            decision = choose(cands, hashes, tree, self.policy)
            extra = {"kv_index": kv_note} if kv_note else {}
        if hashes:
            tree.record(hashes, decision.chosen)  # the replica actually chosen
        self._pending.setdefault(decision.chosen, deque()).append(time.monotonic() + PENDING_TTL)
        return decision.chosen, {"mode": mode, **decision.explain(), **extra}

    @property
    def in_flight(self) -> dict[str, int]:
        """This process's calls in flight per replica (read-only use)."""
        return self._in_flight

    def started(self, replica: str) -> None:
        q = self._pending.get(replica)
        if q:
            q.popleft()  # no longer pending: in flight now
            if not q:
                del self._pending[replica]
        self._in_flight[replica] = self._in_flight.get(replica, 0) + 1

    def finished(self, replica: str) -> None:
        left = self._in_flight.get(replica, 0) - 1
        if left > 0:
            self._in_flight[replica] = left
        else:
            self._in_flight.pop(replica, None)

    def remember(self, request_id: str, subject: str, explanation: dict, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._explained[request_id] = (now + self.explain_ttl, subject, explanation)
        while len(self._explained) > MAX_EXPLANATIONS:
            self._explained.popitem(last=False)
        while self._explained:  # drop the expired from the old end
            first = next(iter(self._explained.values()))
            if first[0] > now:
                break
            self._explained.popitem(last=False)

    def explanation(self, request_id: str, subject: str, now: float | None = None) -> dict | None:
        hit = self._explained.get(request_id)
        now = time.monotonic() if now is None else now
        if hit is None or hit[0] <= now or hit[1] != subject:
            return None
        return hit[2]
