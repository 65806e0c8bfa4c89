"""Prefix routing with a saturation gate (pure): stay on the replica that holds the most of a
prompt until its estimated time to first token exceeds the best replica's by more than a
calibrated penalty, then take the best. Load is measured in tokens, not calls.

Per candidate replica e, for a prompt of ``prompt_tokens``:

    cost(e) = prefill_tokens(e)                 uncached prompt tokens of the calls routed to e, not finished
            + prompt_tokens - matched_tokens(e) this prompt's own uncached tokens on e

cost / peak_prefill_tps is the estimated TTFT. The sticky replica is the conversation's home
(``session_home``, the replica its earlier turns went to) while it holds the most of the prompt
(or nobody holds any), else the replica holding the most (equal holders: the cheapest, then the
fewest calls in flight, then the fewest ``recent`` calls, then a draw), else, when no replica
holds any of it, ``history``: the replica this gateway sent the prompt's prefix to before (its
approximate tree), so a prefix whose blocks every cache evicted is cached again where it was,
not copied onto whichever replica is least loaded (``sticky_from`` says which). In order:

1. ``spread`` (low load: fewer calls in flight than replicas): a new conversation (no home)
   whose sticky replica has taken at least ``hot_share`` times the recent calls of the quietest
   idle replica (no call in flight), plus ``spread_gap``, goes to that idle one when that adds
   at most ``spread_share`` of the prompt in prefill (the idle one already holds most of it, so
   spreading copies little into another cache). When the idle one's cache is known not to be
   evicting (``evicting`` False, from its KV events) the copy displaces nobody's prefix, so the
   conversation goes there whenever the sticky one has taken at least ``spread_gap`` more recent
   calls and the copy costs at most tau (its idle prefill lane keeps the TTFT within the penalty).
2. ``hotspot_guard``: a new conversation whose sticky replica has at least ``hot_share`` times
   the mean calls in flight (counting this one, at least 1) and at least ``hot_gap`` more than
   the least busy goes to the cheapest other replica, when that costs at most tau more; so one
   prefix every call shares (an agent fleet's one system prompt) cannot pile onto one replica.
   A conversation's later turns are not moved by either (moving one re-prefills its history in
   a cache that then holds it twice): only by ``saturated``.
3. ``sticky``: kept while cost(sticky) - min cost <= tau, where

       tau = peak_prefill_tps * max_ttft_penalty_s   (tokens; one number per model, accelerator, engine)

   past it ``saturated``: the cheapest. Without a sticky replica: the cheapest (``load``, or
   ``random_tie`` when all cost the same). Equal costs go to the fewest calls in flight, then
   the fewest recent calls, then a random draw, so a burst does not pile onto a fixed order.

The differences from a threshold gate (llm-d's "sticky until saturated", whose warm set is the
replicas holding at least 0.8 of the prompt): a replica holding 70% of a conversation that just
grew by a tool output is still the sticky one (its saved prefill is counted in tokens, not cut
at a fraction), a call's tokens count as load until it finishes (decode pressure included), new
conversations spread while replicas are idle, and a conversation without a session key keeps a
home replica from its own history (``conversation_key``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from gateway.prefix_router import _text

SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class GatePolicy:
    peak_prefill_tps: float = 8000.0  # the engine's peak prefill (tokens/s): assumed; scripts/bench-prefill measures one
    max_ttft_penalty_s: float = 0.5  # how much TTFT stickiness may cost before it breaks
    tie_tokens: float = 1.0  # costs this close are a tie
    hot_share: float = 1.5  # a new conversation's holder keeps it below this times the mean calls in flight
    hot_gap: int = 4  # ... or below this many more calls in flight than the least busy replica
    spread_gap: float = 1.0  # at low load: spread when the holder's recent calls >= hot_share x an idle one's + this (+ this alone: to a cache not evicting)
    spread_share: float = 0.5  # ... and the idle one must prefill at most this share of the prompt more
    recent_half_life_s: float = 10.0  # how fast ``recent`` forgets a call (Recent)

    @property
    def tau(self) -> float:
        return self.peak_prefill_tps * self.max_ttft_penalty_s


@dataclass(frozen=True)
class GateCandidate:
    replica: str
    matched_tokens: int  # leading tokens of this prompt the replica holds (KV index, or estimated)
    prefill_tokens: float = 0.0  # uncached prompt tokens of the calls routed to it, not finished
    in_flight: int = 0  # calls routed to it, not finished (the hotspot guard's count)
    recent: float = 0.0  # calls routed to it lately, decayed (Recent): where new conversations spread at low load
    evicting: bool | None = None  # whether its cache evicted lately (its KV events' BlockRemoved); None: not known


@dataclass(frozen=True)
class GateDecision:
    chosen: str
    reason: str  # sticky | saturated | spread | hotspot_guard | load | random_tie
    sticky: str | None
    rows: tuple[dict, ...]
    sticky_from: str | None = None  # home | holder | history (None: no sticky replica)

    def explain(self) -> dict:
        return {"chosen": self.chosen, "reason": self.reason, "sticky": self.sticky, "sticky_from": self.sticky_from,
                "scores": list(self.rows)}


def cost(c: GateCandidate, prompt_tokens: int, policy: GatePolicy) -> float:
    return c.prefill_tokens + max(prompt_tokens - c.matched_tokens, 0)


def choose_gated(candidates: list[GateCandidate], prompt_tokens: int, session_home: str | None = None,
                 policy: GatePolicy = GatePolicy(), rng: random.Random | None = None,
                 notes: dict[str, dict] | None = None, history: str | None = None) -> GateDecision:
    """Pure but for ``rng``: the replica for a prompt of ``prompt_tokens``. ``notes``: more
    columns per replica for the explanation's rows (what the caller matched them from).
    ``history``: where the caller sent this prompt's prefix before (``deepest``), the sticky
    replica when no candidate holds any of the prompt and there is no home."""
    if not candidates:
        raise ValueError("no candidate replica")
    rng = rng or random.Random()
    costs = {c.replica: cost(c, prompt_tokens, policy) for c in candidates}
    least = min(costs.values())
    cheapest = _fewest_calls([c for c in candidates if costs[c.replica] <= least + policy.tie_tokens])
    most = max(c.matched_tokens for c in candidates)
    sticky = sticky_from = None
    if session_home in costs and (most == 0 or next(c for c in candidates if c.replica == session_home)
                                  .matched_tokens == most):
        sticky, sticky_from = session_home, "home"
    elif most > 0:  # the best holder; equal holders (a prefix every replica holds): fewest calls, then a draw
        holders = [c for c in candidates if c.matched_tokens == most]
        low = min(costs[c.replica] for c in holders)
        sticky = rng.choice(_fewest_calls([c for c in holders if costs[c.replica] <= low + policy.tie_tokens])).replica
        sticky_from = "holder"
    elif history in costs:  # nobody holds any of it: cache it again where it was sent before
        sticky, sticky_from = history, "history"
    idle = [c for c in candidates if c.in_flight == 0 and c.replica != sticky]
    low_load = sum(c.in_flight for c in candidates) < len(candidates)  # fewer calls in flight than replicas
    if sticky is not None and session_home is None and idle and low_load:  # spread new conversations
        quiet = min(c.recent for c in idle)
        mine = next(c for c in candidates if c.replica == sticky)
        spare = rng.choice([c for c in idle if c.recent == quiet])
        pick, extra = spare.replica, costs[spare.replica] - costs[sticky]
        room = spare.evicting is False  # its cache evicts nothing: the copy displaces no one's prefix
        if (mine.recent >= quiet + policy.spread_gap and extra <= policy.tau) if room else \
                (mine.recent >= policy.hot_share * quiet + policy.spread_gap and extra <= policy.spread_share * prompt_tokens):
            return GateDecision(pick, "spread", sticky, _rows(candidates, costs, notes), sticky_from)
    if sticky is not None and session_home is None and _hot(candidates, sticky, policy):  # the hotspot guard
        others = [c for c in candidates if c.replica != sticky] or candidates
        low = min(costs[c.replica] for c in others)
        pick = rng.choice(_fewest_calls([c for c in others if costs[c.replica] <= low + policy.tie_tokens])).replica
        if costs[pick] - costs[sticky] <= policy.tau:
            return GateDecision(pick, "hotspot_guard", sticky, _rows(candidates, costs, notes), sticky_from)
    if sticky is not None and costs[sticky] - least <= policy.tau:
        chosen, reason = sticky, "sticky"
    elif sticky is not None:
        chosen, reason = rng.choice(cheapest).replica, "saturated"
    else:
        chosen = rng.choice(cheapest).replica
        reason = "random_tie" if len(cheapest) == len(candidates) else "load"
    return GateDecision(chosen, reason, sticky, _rows(candidates, costs, notes), sticky_from)


class Recent:
    """Calls routed per replica, each forgotten with a half-life: count(now) = sum 2^-(age/half)."""

    MAX_REPLICAS = 4096

    def __init__(self, half_life_s: float) -> None:
        self.half = half_life_s
        self._v: dict[str, tuple[float, float]] = {}  # replica -> (value, at)

    def value(self, replica: str, now: float) -> float:
        v, at = self._v.get(replica, (0.0, now))
        return v * 2.0 ** (-(now - at) / self.half)

    def add(self, replica: str, now: float) -> None:
        self._v[replica] = (self.value(replica, now) + 1.0, now)
        if len(self._v) > self.MAX_REPLICAS:  # bounded: replicas gone quiet are dropped
            for r in [r for r in self._v if self.value(r, now) < 0.01]:
                del self._v[r]


def _fewest_calls(pool: list[GateCandidate]) -> list[GateCandidate]:
    """The fewest calls in flight, then the fewest lately (within half a call)."""
    lo = min(c.in_flight for c in pool)
    pool = [c for c in pool if c.in_flight == lo]
    quiet = min(c.recent for c in pool)
    return [c for c in pool if c.recent <= quiet + 0.5]


def _hot(candidates: list[GateCandidate], replica: str, policy: GatePolicy) -> bool:
    """Whether ``replica`` has at least ``hot_share`` times the mean calls in flight (counting
    the call being placed), and at least one more than the least busy replica."""
    total = sum(c.in_flight for c in candidates)
    mine = next(c.in_flight for c in candidates if c.replica == replica)
    fewest = min(c.in_flight for c in candidates)
    return mine >= max(policy.hot_share * (total + 1) / len(candidates), 1.0) and mine - fewest >= policy.hot_gap


def _rows(candidates: list[GateCandidate], costs: dict[str, float],
          notes: dict[str, dict] | None) -> tuple[dict, ...]:
    return tuple({"replica": c.replica, "matched_tokens": c.matched_tokens, "prefill_tokens": round(c.prefill_tokens, 1),
                  "in_flight": c.in_flight, "cost_tokens": round(costs[c.replica], 1),
                  **(notes or {}).get(c.replica, {})}
                 for c in sorted(candidates, key=lambda c: costs[c.replica]))


def conversation_key(data: dict | None) -> str | None:
    """A conversation's own key, from its history, for traffic without ``x-session-id``: the hash
    of its system prompt(s) and its first user turn. Every later turn of the conversation resends
    both unchanged, so all its turns share the key; conversations on one shared system prompt
    differ by their first user turn. None for a body that is not a chat with a user turn."""
    msgs = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(msgs, list):
        return None
    h = hashlib.blake2b(digest_size=16)
    for m in msgs:
        if not isinstance(m, dict):
            return None
        role = m.get("role")
        h.update(str(role).encode() + b"\0" + _text(m.get("content")).encode() + b"\0")
        if role == "user":
            return h.hexdigest()
        if role not in SYSTEM_ROLES:
            return None
    return None

