"""The gateway's own replica choice for endpoints whose ``routing_l7`` is not ``affinity``, and
the explanations of recent choices (GET /api/ai/explain/request/{request_id}).

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
from collections import OrderedDict
from dataclasses import dataclass, field

from gateway.prefix_router import Candidate, PrefixPolicy, PrefixTree, choose, chunk_hashes, render_prompt
from gateway.upstreams import MAX_READING_AGE, EndpointView

MAX_ENDPOINTS = 256
MAX_EXPLANATIONS = 10_000
EXPLAIN_TTL = 600.0


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
            out.append(Candidate(r.replica_id, queue, self._in_flight.get(r.replica_id, 0)))
        return out

    def pick(self, view: EndpointView, data: dict | None, now: float) -> tuple[str, dict]:
        """(replica id, explanation) for a view with at least one replica."""
        mode, name = view.endpoint.routing_l7, view.endpoint.name
        cands = self.candidates(view, now)
        loads = [{"replica": c.replica, "queue": c.queue, "in_flight": c.in_flight} for c in cands]
        if mode == "round_robin":
            i = self._rr.get(name, 0)
            self._rr[name] = i + 1
            return cands[i % len(cands)].replica, {"mode": mode, "reason": "next in turn", "scores": loads}
        if mode == "random":
            return self._rng.choice(cands).replica, {"mode": mode, "reason": "uniform draw", "scores": loads}
        hashes = chunk_hashes(render_prompt(data)) if data else []
        tree = self._tree(name)
        decision = choose(cands, hashes, tree, self.policy)
        if hashes:
            tree.record(hashes, decision.chosen)  # the replica actually chosen
        return decision.chosen, {"mode": mode, **decision.explain()}

    @property
    def in_flight(self) -> dict[str, int]:
        """This process's calls in flight per replica (read-only use)."""
        return self._in_flight

    def started(self, replica: str) -> None:
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
