"""The gateway's own replica choice for endpoints whose ``routing_l7`` is not ``affinity``, and
the explanations of recent choices (GET /api/ai/explain/request/{request_id}).

``prefix`` endpoints are scored by the saturation gate (gateway/router_gate.choose_gated): cost
in tokens, stay on the replica holding the most of the prompt (or the conversation's home) until
it costs tau more than the cheapest. What each replica holds comes from the agents' KV index
when the endpoint has a KV-index source (``kv``, precise: ``apick`` computes the request's
engine block hashes with gateway/engine_hash.py and asks agent/kv_index), else from the
approximate tree (gateway/prefix_router.PrefixTree, chunks of CHUNK_CHARS characters at
CHARS_PER_TOKEN characters a token); a request that cannot be hashed, an index that does not
answer, and replicas that sent no KV events fall back to the tree (the explanation says which:
``kv_index``, ``blind_replicas``; ``kv_states`` and ``kv_blind`` give each replica's state in
the agents' answer, gateway/kv_blind.py; ``kv_other_model`` the replicas of a revision with
another model than the tokenizer's, gateway/kv_source.py). With the matches, the source's
``evicting(view)`` (whether each replica's engine evicted lately, from its KV events) goes to the
gate as GateCandidate.evicting; the approximate router does not know it (None).

Token load per replica (what a gateway can know): the uncached prompt tokens of this process's
calls to it that have not finished (``started`` .. ``finished``), those of its calls chosen but
not started yet (``pending``, expiring after PENDING_TTL if a call never starts), and the
engine's scraped queue depth (waiting calls of every gateway, at most MAX_READING_AGE old)
counted at this prompt's size. A conversation's home is the replica its last turn went to,
keyed by router_gate.conversation_key and the call's cache salt (at most MAX_HOMES per process).

State per gateway process: one PrefixTree per endpoint (at most MAX_ENDPOINTS; a new one past
that replaces the least recently used), the load above, a round-robin counter per endpoint, the
homes, and the explanations: at most MAX_EXPLANATIONS, each kept EXPLAIN_TTL seconds, readable
only by the credential that made the call (others get the same 404 as an unknown id, so ids
reveal nothing across callers).
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace

from gateway.prefix_router import CHUNK_CHARS, PrefixTree, chunk_hashes, deepest, render_prompt
from gateway.router_gate import GateCandidate, GatePolicy, Recent, choose_gated, conversation_key
from gateway.upstreams import MAX_READING_AGE, EndpointView

MAX_ENDPOINTS = 256
MAX_EXPLANATIONS = 10_000
EXPLAIN_TTL = 600.0
PENDING_TTL = 10.0  # a chosen call that has not started by then (refused at admission) stops counting
CHARS_PER_TOKEN = 4  # the approximate tree's token estimate
MAX_HOMES = 100_000


@dataclass
class ReplicaRouter:
    policy: GatePolicy = field(default_factory=GatePolicy)
    max_nodes: int = 100_000
    explain_ttl: float = EXPLAIN_TTL  # FABRIC_GATEWAY_EXPLAIN_SECS
    _trees: OrderedDict[str, PrefixTree] = field(default_factory=OrderedDict)
    _in_flight: dict[str, int] = field(default_factory=dict)
    _tokens: dict[str, float] = field(default_factory=dict)  # uncached prompt tokens of the calls in flight
    _rr: dict[str, int] = field(default_factory=dict)
    _explained: OrderedDict[str, tuple[float, str, dict]] = field(default_factory=OrderedDict)
    _rng: random.Random = field(default_factory=random.Random)
    kv: object | None = None  # a KV-index source: .hasher(view) -> a hasher (async .hash_request) | None, async .match(view, hashes)
    _pending: dict[str, deque] = field(default_factory=dict)  # replica -> (expiry, tokens) per call chosen, not started
    _homes: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _recent: Recent = field(init=False)  # calls routed per replica lately (where new conversations spread)

    def __post_init__(self) -> None:
        self._recent = Recent(self.policy.recent_half_life_s)

    def _tree(self, endpoint: str) -> PrefixTree:
        tree = self._trees.get(endpoint)
        if tree is None:
            tree = self._trees[endpoint] = PrefixTree(self.max_nodes)
            while len(self._trees) > MAX_ENDPOINTS:
                self._trees.popitem(last=False)
        self._trees.move_to_end(endpoint)
        return tree

    def candidates(self, view: EndpointView, now: float, prompt_tokens: int = 0) -> list[GateCandidate]:
        """Each replica's load as the gate reads it (matched_tokens 0: the caller fills it in)."""
        out = []
        for r in view.replicas:
            reading = view.queue_depths.get(r.replica_id)
            queue = reading[0] if reading is not None and now - reading[1] < MAX_READING_AGE else 0.0
            pending = self._pending_live(r.replica_id)
            tokens = self._tokens.get(r.replica_id, 0.0) + sum(t for _, t in pending) + queue * prompt_tokens
            out.append(GateCandidate(r.replica_id, 0, tokens, self._in_flight.get(r.replica_id, 0) + len(pending),
                                     self._recent_calls(r.replica_id)))
        return out

    def _recent_calls(self, replica: str) -> float:
        return self._recent.value(replica, time.monotonic())

    def pending(self, replica: str) -> int:
        """This process's calls chosen for ``replica`` and not started yet."""
        return len(self._pending_live(replica))

    def _pending_live(self, replica: str) -> deque:
        q = self._pending.get(replica)
        if q is None:
            return deque()
        now = time.monotonic()
        while q and q[0][0] <= now:
            q.popleft()
        return q

    async def apick(self, view: EndpointView, data: dict | None, now: float) -> tuple[str, dict]:
        """``pick``, with the agents' KV index asked first when the endpoint routes by prefix."""
        kv_note = None
        matched = hashes = evicting = None
        block_tokens = 16
        if self.kv is not None and data and view.endpoint.routing_l7 == "prefix":
            hasher = await self.kv.hasher(view)
            hashes = await hasher.hash_request(data) if hasher is not None else None
            block_tokens = getattr(getattr(hasher, "hasher", None), "block_size", block_tokens)
            if hasher is None:
                kv_note = "approximate: no tokenizer for this model"
            elif hashes is None:
                kv_note = "approximate: the request cannot be tokenized here in time"
            else:
                try:
                    matched = await self.kv.match(view, hashes)
                except Exception as exc:  # any transport error: route approximately, say why
                    kv_note = f"approximate: the KV index did not answer ({type(exc).__name__})"
                else:  # the same answer's evictions (a source without them: not known)
                    evicting = self.kv.evicting(view) if hasattr(self.kv, "evicting") else None
        picked, why = self.pick(view, data, now, matched=matched, block_hashes=hashes, kv_note=kv_note,
                                block_tokens=block_tokens, evicting=evicting)
        if matched is not None and hasattr(self.kv, "states"):  # live | warming | blind | refused | ...
            states = self.kv.states(view)
            why["kv_states"] = states
            why["kv_blind"] = sorted(r for r, s in states.items() if s == "blind")
            why["kv_other_model"] = sorted(r for r, s in states.items() if s == "other_model")  # mid-rollout
        return picked, why

    def pick(self, view: EndpointView, data: dict | None, now: float, *, matched: dict | None = None,
             block_hashes: list[int] | None = None, kv_note: str | None = None,
             block_tokens: int = 16, evicting: dict[str, bool | None] | None = None) -> tuple[str, dict]:
        """(replica id, explanation) for a view with at least one replica; ``matched`` (the KV
        index's answer for ``block_hashes``) makes a prefix endpoint's choice precise, and
        ``evicting`` (the same answer's) tells the gate which replicas' caches evict. The
        explanation's ``load_tokens`` is what the call adds to its replica's token load: pass it
        to ``started`` and ``finished``."""
        mode, name = view.endpoint.routing_l7, view.endpoint.name
        if mode in ("round_robin", "random"):
            cands = self.candidates(view, now)
            loads = [{"replica": c.replica, "in_flight": c.in_flight} for c in cands]
            if mode == "round_robin":
                i = self._rr.get(name, 0)
                self._rr[name] = i + 1
                chosen, reason = cands[i % len(cands)].replica, "next in turn"
            else:
                chosen, reason = self._rng.choice(cands).replica, "uniform draw"
            self._pending.setdefault(chosen, deque()).append((time.monotonic() + PENDING_TTL, 0.0))
            return chosen, {"mode": mode, "reason": reason, "scores": loads, "load_tokens": 0.0}
        salt = data.get("cache_salt") if data else None  # per tenant (gateway.cache_salt)
        salt = salt if isinstance(salt, str) else None
        text = render_prompt(data) if data else ""
        hashes = chunk_hashes(text, salt=salt) if data else []
        tree = self._tree(name)
        approx = tree.match(hashes)  # replica -> (chunks of this prompt it served, hits on the deepest)
        chunk_tokens = CHUNK_CHARS / CHARS_PER_TOKEN
        notes: dict[str, dict] = {}
        held: dict[str, int] = {}
        flags: dict[str, bool | None] = {}
        if matched is not None and block_hashes is not None and mode == "prefix":
            flags = {r: evicting.get(r) for r in matched} if evicting else {}
            prompt_tokens = len(block_hashes) * block_tokens
            for r in view.replicas:
                got = matched.get(r.replica_id)
                depth = approx.get(r.replica_id, (0, 0))[0]
                if got is None:  # blind: what the tree says it served
                    held[r.replica_id] = min(int(depth * chunk_tokens), prompt_tokens)
                    notes[r.replica_id] = {"matched_blocks": None, "approx_chunks": depth, "blind": True}
                else:
                    held[r.replica_id] = got * block_tokens
                    notes[r.replica_id] = {"matched_blocks": got, "approx_chunks": None, "blind": False,
                                           "evicting": flags.get(r.replica_id)}
            extra = {"kv_index": "precise", "blind_replicas": sorted(r for r, n in matched.items() if n is None),
                     "prompt_blocks": len(block_hashes)}
            # where this gateway sent the prefix before (a replica still in the view): for when no engine holds any
            history = deepest({r: m for r, m in approx.items() if r in held})
        else:
            history = None  # the tree's matches are the held tokens already
            prompt_tokens = max(len(text) // CHARS_PER_TOKEN, 1)
            for r in view.replicas:
                depth, hits = approx.get(r.replica_id, (0, 0))
                held[r.replica_id] = min(int(depth * chunk_tokens), prompt_tokens)
                notes[r.replica_id] = {"matched_chunks": depth, "hits": hits}
            extra = {"prompt_chunks": len(hashes), **({"kv_index": kv_note} if kv_note else {})}
        cands = [replace(c, matched_tokens=held.get(c.replica, 0), evicting=flags.get(c.replica))
                 for c in self.candidates(view, now, prompt_tokens)]
        key = conversation_key(data)
        home_key = f"{name}\0{salt or ''}\0{key}" if key else None
        home = self._homes.get(home_key) if home_key else None
        decision = choose_gated(cands, prompt_tokens, home, self.policy, self._rng, notes, history)
        chosen = decision.chosen
        self._recent.add(chosen, time.monotonic())
        if hashes:
            tree.record(hashes, chosen)  # the replica actually chosen
        if home_key:
            self._homes[home_key] = chosen
            self._homes.move_to_end(home_key)
            while len(self._homes) > MAX_HOMES:
                self._homes.popitem(last=False)
        load = float(max(prompt_tokens - held.get(chosen, 0), 0))
        self._pending.setdefault(chosen, deque()).append((time.monotonic() + PENDING_TTL, load))
        return chosen, {"mode": mode, **decision.explain(), "prompt_tokens": prompt_tokens,
                        "tau_tokens": self.policy.tau, "load_tokens": load, **extra}

    @property
    def in_flight(self) -> dict[str, int]:
        """This process's calls in flight per replica (read-only use)."""
        return self._in_flight

    def started(self, replica: str, tokens: float = 0.0) -> None:
        """A call chosen for ``replica`` started; ``tokens``: its explanation's ``load_tokens``."""
        q = self._pending.get(replica)
        if q:  # no longer pending: in flight now (its own entry, else the oldest)
            at = next((i for i, (_, t) in enumerate(q) if t == tokens), 0)
            del q[at]
            if not q:
                del self._pending[replica]
        self._in_flight[replica] = self._in_flight.get(replica, 0) + 1
        if tokens:
            self._tokens[replica] = self._tokens.get(replica, 0.0) + tokens

    def finished(self, replica: str, tokens: float = 0.0) -> None:
        left = self._in_flight.get(replica, 0) - 1
        if left > 0:
            self._in_flight[replica] = left
        else:
            self._in_flight.pop(replica, None)
        rest = self._tokens.get(replica, 0.0) - tokens
        if left > 0 and rest > 0:
            self._tokens[replica] = rest
        else:
            self._tokens.pop(replica, None)

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
