"""scripts/bench-router's shared_prefix run: a discrete-event simulation of engines behind the
gateway's own replica choice (the real scorers of gateway/prefix_router.py and the real block
index of agent/kv_index), pure and seeded, so one run gives the same table on any machine.

Workload: inference-perf's ``shared_prefix`` shape, generated here (not inference-perf itself):
``groups`` x ``prompts_per_group`` prompts, each a group's system prompt of ``system_tokens``
followed by one of the group's questions of ``question_tokens``; ``output_tokens`` out; Poisson
arrivals in ``stages`` of (rate/s, seconds), each call a uniform draw from the prompt pool. Tokens
are the simulator's (common/kv_events.sim_token_ids, 4 characters each) and blocks are hashed as
vLLM does (BlockHasher, 16 tokens).

Engine (``Engine``, shared with gateway/router_profiles.py): at most ``max_num_seqs`` sequences run, and only while their blocks (prompt blocks not
already held by another running sequence, plus their output blocks) fit in the KV cache's
``cache_blocks`` (vLLM's admission); the rest wait, first come first served. An admitted sequence looks
its prompt up in the prefix cache (leading cached blocks hit), then prefills its uncached tokens
at ``prefill_tps`` tokens/s on the engine's one prefill lane (a serial resource: misses queue
behind each other), then decodes ``output_tokens`` at ``decode_tps`` per sequence. Blocks no running
sequence holds stay cached until the least recently used are evicted for new ones; the cache is
below the working set; every store and eviction is a KV event,
applied to the precise router's index ``event_lag_s`` later.

Routers: random; least_queue (fewest of this gateway's calls in flight); and the gateway's
saturation gate (gateway/router_gate.choose_gated, load in uncached prompt tokens of calls in
flight, GateLoad) reading what each replica holds from: the approximate PrefixTree on the rendered
text (approximate), the KV index fed by events (precise), or each engine's cache read at decision
time (oracle). Columns, as llm-d reports them, over the calls that
arrived in the last (highest) stage: output tok/s, requests/s, TTFT p90 and mean, wait-queue mean
(waiting sequences per replica, sampled at each arrival), KV usage (distinct blocks of running
sequences / cache blocks, same samples), prefix-cache hit rate (hit tokens / prompt tokens).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from common.kv_events import Batch, BlockHasher, block_removed, block_stored, sim_token_ids
from common.kv_index import KvIndex
from gateway.prefix_router import PrefixTree, chunk_hashes, deepest
from gateway.router_gate import GateCandidate, GatePolicy, Recent, choose_gated

ROUTERS = ("random", "least_queue", "approximate", "precise", "oracle")
GATED = ("approximate", "precise", "oracle")


@dataclass(frozen=True)
class BenchConfig:
    replicas: int = 4
    groups: int = 24
    prompts_per_group: int = 3
    system_tokens: int = 1600
    question_tokens: int = 160
    output_tokens: int = 64
    stages: tuple[tuple[float, float], ...] = ((10.0, 20.0), (20.0, 20.0), (40.0, 20.0), (60.0, 20.0))
    cache_blocks: int = 1200
    max_num_seqs: int = 128
    prefill_tps: float = 8000.0
    decode_tps: float = 40.0
    event_lag_s: float = 0.05
    block_tokens: int = 16
    seed: int = 0


@dataclass
class Prompt:
    text: str
    tokens: int
    blocks: list[int]
    chunks: list[bytes]


def make_prompts(cfg: BenchConfig) -> list[Prompt]:
    rng = random.Random(cfg.seed)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]

    def text_of(n_tokens: int, tag: str) -> str:
        out = tag
        while len(out) < 4 * n_tokens:
            out += " " + rng.choice(words)
        return out[:4 * n_tokens]

    hasher = BlockHasher(cfg.block_tokens)
    prompts = []
    for g in range(cfg.groups):
        system = text_of(cfg.system_tokens, f"<|system|>group {g}: ")
        for q in range(cfg.prompts_per_group):
            text = system + text_of(cfg.question_tokens, f"<|user|>question {g}.{q}: ")
            ids = sim_token_ids(text)
            prompts.append(Prompt(text, len(ids), hasher.hashes(ids), chunk_hashes(text)))
    return prompts


@dataclass
class Call:
    id: int
    prompt: Prompt
    arrived: float
    stage: int
    out: int
    replica: int = -1
    first_token: float | None = None
    done: float | None = None
    hit_tokens: int = 0
    load_tokens: int = 0

    @property
    def blocks(self) -> list[int]:
        return self.prompt.blocks


@dataclass
class Engine:
    """One simulated engine (shared by both benches): a call is anything with ``id``, ``blocks``
    (its prompt's block hashes) and ``out`` (its output tokens)."""
    cache_blocks: int
    max_num_seqs: int
    block_tokens: int = 16
    cache: OrderedDict = field(default_factory=OrderedDict)
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)  # call id -> the call
    in_use: dict = field(default_factory=dict)  # block -> running sequences holding it
    prefill_free_at: float = 0.0

    def out_blocks(self, c) -> int:
        return -(-c.out // self.block_tokens)

    def held_out(self) -> int:
        return sum(self.out_blocks(c) for c in self.running.values())

    def fits(self, c) -> bool:
        """vLLM's admission: the sequence's new prompt blocks and its output blocks fit in the KV
        cache's blocks not held by running sequences (cached, unused blocks are evictable)."""
        if len(self.running) >= self.max_num_seqs:
            return False
        new = sum(1 for h in c.blocks if h not in self.in_use)
        return len(self.in_use) + self.held_out() + new + self.out_blocks(c) <= self.cache_blocks or not self.running

    def held(self, blocks: list[int]) -> int:
        n = 0
        for h in blocks:
            if h not in self.cache:
                break
            n += 1
        return n

    def admit(self, c) -> tuple[int, list[int]]:
        """Run ``c``: (its leading cached blocks, the blocks evicted for it; least recently used
        first, never one a running sequence holds)."""
        hit = self.held(c.blocks)
        for h in c.blocks:
            self.cache[h] = None
            self.cache.move_to_end(h)
        budget = self.cache_blocks - self.held_out() - self.out_blocks(c)
        evicted = []
        if len(self.cache) > budget:
            keep = set(c.blocks)
            for h in list(self.cache):
                if len(self.cache) <= budget:
                    break
                if h not in self.in_use and h not in keep:
                    del self.cache[h]
                    evicted.append(h)
        self.running[c.id] = c
        for h in c.blocks:
            self.in_use[h] = self.in_use.get(h, 0) + 1
        return hit, evicted

    def release(self, c) -> None:
        self.running.pop(c.id, None)
        for h in c.blocks:
            left = self.in_use[h] - 1
            if left:
                self.in_use[h] = left
            else:
                del self.in_use[h]


@dataclass
class GateLoad:
    """The gate's load view in a simulation, as a gateway keeps it (gateway/replica_router.py):
    per replica, the uncached prompt tokens and the calls routed there and not finished."""
    replicas: int
    tokens: list = field(default_factory=list)
    calls: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens, self.calls = [0.0] * self.replicas, [0] * self.replicas
        self.recent: Recent | None = None

    def pick(self, held_tokens: list[int], prompt_tokens: int, home: int | None, policy: GatePolicy,
             rng: random.Random, now: float, evicting: list[bool] | None = None,
             history: str | None = None) -> tuple[int, int]:
        """(replica, the call's load tokens) by router_gate.choose_gated; counted until ``done``.
        ``evicting``: per replica, whether its KV events showed an eviction lately (None: not known);
        ``history``: the replica the router's tree says this prefix was sent to (prefix_router.deepest)."""
        names = [f"r{i}" for i in range(self.replicas)]
        self.recent = self.recent or Recent(policy.recent_half_life_s)
        cands = [GateCandidate(names[i], held_tokens[i], self.tokens[i], self.calls[i],
                               self.recent.value(names[i], now), None if evicting is None else evicting[i])
                 for i in range(self.replicas)]
        i = names.index(choose_gated(cands, prompt_tokens, names[home] if home is not None else None,
                                     policy, rng, history=history).chosen)
        self.recent.add(names[i], now)
        load = max(prompt_tokens - held_tokens[i], 0)
        self.tokens[i] += load
        self.calls[i] += 1
        return i, load

    def done(self, i: int, load: int) -> None:
        self.tokens[i] -= load
        self.calls[i] -= 1


def simulate(cfg: BenchConfig, router: str) -> dict:
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}")
    prompts = make_prompts(cfg)
    rng = random.Random(cfg.seed + 1)  # the arrivals: the same for every router
    choice_rng = random.Random(cfg.seed + 2)
    engines = [Engine(cfg.cache_blocks, cfg.max_num_seqs, cfg.block_tokens) for _ in range(cfg.replicas)]
    names = [f"r{i}" for i in range(cfg.replicas)]
    tree, kv, gate = PrefixTree(), KvIndex(), GateLoad(cfg.replicas)
    policy = GatePolicy(peak_prefill_tps=cfg.prefill_tps)
    for n in names:  # every engine publishes from the start
        kv.apply(n, 0, Batch(0.0, [], 0), now=0.0)
    seqs = {n: 0 for n in names}
    in_flight = [0] * cfg.replicas
    events: list = []
    calls: list[Call] = []
    t, cid = 0.0, 0
    for stage, (rate, secs) in enumerate(cfg.stages):
        end = t + secs
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                t = end
                break
            calls.append(Call(cid, rng.choice(prompts), t, stage, cfg.output_tokens))
            cid += 1

    order = 0

    def push(at: float, kind: str, payload) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, payload))

    for c in calls:
        push(c.arrived, "arrive", c)
    samples: list[tuple[int, float, float]] = []  # (stage, waiting per replica, kv usage)

    def publish(i: int, at: float, stored: list[int], evicted: list[int]) -> None:
        evs = [block_stored(stored, None, [], cfg.block_tokens)]
        if evicted:
            evs.append(block_removed(evicted))
        push(at + cfg.event_lag_s, "kv", (names[i], Batch(at, evs, 0)))

    def admit(i: int, c: Call, now: float) -> None:
        e = engines[i]
        hit, evicted = e.admit(c)
        publish(i, now, c.prompt.blocks, evicted)
        c.hit_tokens = min(c.prompt.tokens, hit * cfg.block_tokens)
        start = max(now, e.prefill_free_at)
        e.prefill_free_at = start + (c.prompt.tokens - c.hit_tokens) / cfg.prefill_tps
        c.first_token = e.prefill_free_at
        push(c.first_token + cfg.output_tokens / cfg.decode_tps, "finish", c)

    def pick(c: Call, now: float) -> int:
        if router == "random":
            return choice_rng.randrange(cfg.replicas)
        if router == "least_queue":
            least = min(in_flight)
            return choice_rng.choice([i for i in range(cfg.replicas) if in_flight[i] == least])
        chunk_tokens = c.prompt.tokens / max(len(c.prompt.chunks), 1)
        if router == "approximate":
            got = tree.match(c.prompt.chunks)
            held = [int(got.get(n, (0, 0))[0] * chunk_tokens) for n in names]
        elif router == "precise":  # the index; the tree's history when no replica holds any (choose_gated)
            got_blocks = kv.match(c.prompt.blocks, names)
            held = [int(got_blocks.get(n) or 0) * cfg.block_tokens for n in names]
        else:  # oracle: every engine's cache as it is now
            held = [e.held(c.prompt.blocks) * cfg.block_tokens for e in engines]
        history = deepest(tree.match(c.prompt.chunks)) if router in ("precise", "oracle") else None
        i, c.load_tokens = gate.pick([min(h, c.prompt.tokens) for h in held], c.prompt.tokens, None, policy,
                                     choice_rng, now, history=history)
        if router in GATED:
            tree.record(c.prompt.chunks, names[i])
        return i

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            c = payload
            i = pick(c, now)
            c.replica = i
            in_flight[i] += 1
            e = engines[i]
            if not e.waiting and e.fits(c):
                admit(i, c, now)
            else:
                e.waiting.append(c)  # first come, first served: nothing passes the head
            usage = sum((len(x.in_use) + x.held_out()) / cfg.cache_blocks for x in engines)
            usage /= cfg.replicas
            samples.append((c.stage, sum(len(x.waiting) for x in engines) / cfg.replicas, min(usage, 1.0)))
        elif kind == "finish":
            c = payload
            c.done = now
            e = engines[c.replica]
            in_flight[c.replica] -= 1
            if router in GATED:
                gate.done(c.replica, c.load_tokens)
            e.release(c)
            while e.waiting and e.fits(e.waiting[0]):
                admit(c.replica, e.waiting.popleft(), now)
        elif kind == "kv":
            name, batch = payload
            seqs[name] += 1
            kv.apply(name, seqs[name], batch, now=now)
    return summarize(cfg, calls, samples)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarize(cfg: BenchConfig, calls: list[Call], samples: list) -> dict:
    last = len(cfg.stages) - 1
    mine = [c for c in calls if c.stage == last]
    start = sum(secs for _, secs in cfg.stages[:last])
    end = max((c.done for c in mine), default=start + cfg.stages[last][1])
    span = max(end - start, 1e-9)
    ttft = [c.first_token - c.arrived for c in mine]
    prompt_tokens = sum(c.prompt.tokens for c in mine)
    mine_samples = [s for s in samples if s[0] == last]
    per_stage = []
    for k, (rate, secs) in enumerate(cfg.stages):
        cs = [c for c in calls if c.stage == k]
        t0 = sum(x for _, x in cfg.stages[:k])
        t1 = max((c.done for c in cs), default=t0 + secs)
        per_stage.append({"rate": rate, "calls": len(cs),
                          "output_tok_s": round(len(cs) * cfg.output_tokens / max(t1 - t0, 1e-9), 1),
                          "ttft_p90_s": round(_p([c.first_token - c.arrived for c in cs], 0.9), 3)})
    return {
        "output_tok_s": round(len(mine) * cfg.output_tokens / span, 1),
        "requests_s": round(len(mine) / span, 2),
        "ttft_p90_s": round(_p(ttft, 0.9), 3),
        "ttft_mean_s": round(sum(ttft) / len(ttft), 3) if ttft else 0.0,
        "wait_queue_mean": round(sum(s[1] for s in mine_samples) / len(mine_samples), 2) if mine_samples else 0.0,
        "kv_usage_mean": round(sum(s[2] for s in mine_samples) / len(mine_samples), 3) if mine_samples else 0.0,
        "hit_rate": round(sum(c.hit_tokens for c in mine) / prompt_tokens, 4) if prompt_tokens else 0.0,
        "calls": len(mine),
        "calls_per_replica": [sum(1 for c in mine if c.replica == i) for i in range(cfg.replicas)],
        "stages": per_stage,
    }


def run(cfg: BenchConfig, routers: tuple[str, ...] = ROUTERS) -> dict:
    rows = {r: simulate(cfg, r) for r in routers}
    out = {"generator": "Fabric's own shared_prefix generator (inference-perf's workload shape; "
                        "inference-perf itself was not used)", "rows": rows}
    if {"precise", "approximate", "oracle"} <= set(rows):
        p, a, o = rows["precise"], rows["approximate"], rows["oracle"]
        out["ratios"] = {
            "precise_over_approximate_tok_s": round(p["output_tok_s"] / a["output_tok_s"], 3)
            if a["output_tok_s"] else None,
            "precise_over_approximate_ttft_p90": round(p["ttft_p90_s"] / a["ttft_p90_s"], 3)
            if a["ttft_p90_s"] else None,
            "oracle_minus_precise_hit_rate_points": round(100 * (o["hit_rate"] - p["hit_rate"]), 2),
        }
        r = out["ratios"]
        out["targets"] = {
            "precise_tok_s_at_least_1_2x_approximate": bool(r["precise_over_approximate_tok_s"] is not None
                                                            and r["precise_over_approximate_tok_s"] >= 1.2),
            "precise_ttft_p90_at_most_0_5x_approximate": bool(r["precise_over_approximate_ttft_p90"] is not None
                                                              and r["precise_over_approximate_ttft_p90"] <= 0.5),
            "precise_hit_rate_within_5_points_of_oracle": r["oracle_minus_precise_hit_rate_points"] <= 5.0,
        }
    return out
