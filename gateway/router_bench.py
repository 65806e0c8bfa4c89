"""scripts/bench-router's shared_prefix run: a discrete-event simulation of engines behind the
gateway's own replica choice (the real scorers of gateway/prefix_router.py and the real block
index of agent/kv_index), pure and seeded, so one run gives the same table on any machine.

Workload: inference-perf's ``shared_prefix`` shape, generated here (not inference-perf itself):
``groups`` x ``prompts_per_group`` prompts, each a group's system prompt of ``system_tokens``
followed by one of the group's questions of ``question_tokens``; ``output_tokens`` out; Poisson
arrivals in ``stages`` of (rate/s, seconds), each call a uniform draw from the prompt pool. Tokens
are the simulator's (common/kv_events.sim_token_ids, 4 characters each) and blocks are hashed as
vLLM does (BlockHasher, 16 tokens).

Engine: at most ``max_num_seqs`` sequences run, and only while their blocks (prompt blocks not
already held by another running sequence, plus their output blocks) fit in the KV cache's
``cache_blocks`` (vLLM's admission); the rest wait, first come first served. An admitted sequence looks
its prompt up in the prefix cache (leading cached blocks hit), then prefills its uncached tokens
at ``prefill_tps`` tokens/s on the engine's one prefill lane (a serial resource: misses queue
behind each other), then decodes ``output_tokens`` at ``decode_tps`` per sequence. Blocks no running
sequence holds stay cached until the least recently used are evicted for new ones; the cache is
below the working set; every store and eviction is a KV event,
applied to the precise router's index ``event_lag_s`` later.

Routers: random; least_queue (fewest of this gateway's calls in flight); approximate (today's
PrefixTree + choose on the rendered text, load = scraped queue + in flight, scraped every
``scrape_s``); precise (choose_precise on the KV index fed by events); oracle (choose_precise on
each engine's cache read at decision time). Columns, as llm-d reports them, over the calls that
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
from gateway.prefix_router import Candidate, PrefixPolicy, PrefixTree, choose, choose_precise, chunk_hashes

ROUTERS = ("random", "least_queue", "approximate", "precise", "oracle")


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
    scrape_s: float = 1.0
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
    replica: int = -1
    first_token: float | None = None
    done: float | None = None
    hit_tokens: int = 0


@dataclass
class Engine:
    cfg: BenchConfig
    index: int
    cache: OrderedDict = field(default_factory=OrderedDict)
    waiting: deque = field(default_factory=deque)
    running: dict = field(default_factory=dict)  # call id -> its prompt's blocks
    in_use: dict = field(default_factory=dict)  # block -> running sequences holding it
    prefill_free_at: float = 0.0

    def out_blocks(self) -> int:
        return -(-self.cfg.output_tokens // self.cfg.block_tokens)

    def fits(self, blocks: list[int]) -> bool:
        """vLLM's admission: the sequence's new prompt blocks and its output blocks fit in the KV
        cache's blocks not held by running sequences (cached, unused blocks are evictable)."""
        if len(self.running) >= self.cfg.max_num_seqs:
            return False
        new = sum(1 for h in blocks if h not in self.in_use)
        held = len(self.in_use) + self.out_blocks() * len(self.running)
        return held + new + self.out_blocks() <= self.cfg.cache_blocks or not self.running

    def lookup_insert(self, blocks: list[int]) -> tuple[int, list[int]]:
        hit = 0
        for h in blocks:
            if h not in self.cache:
                break
            hit += 1
        for h in blocks:
            self.cache[h] = None
            self.cache.move_to_end(h)
        evicted = []
        budget = self.cfg.cache_blocks - self.out_blocks() * (len(self.running) + 1)
        if len(self.cache) > budget:
            keep = set(blocks)
            for h in list(self.cache):  # least recently used first; blocks in use stay
                if len(self.cache) <= budget:
                    break
                if h not in self.in_use and h not in keep:
                    del self.cache[h]
                    evicted.append(h)
        return hit, evicted

    def held(self, blocks: list[int]) -> int:
        n = 0
        for h in blocks:
            if h not in self.cache:
                break
            n += 1
        return n


def simulate(cfg: BenchConfig, router: str) -> dict:
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}")
    prompts = make_prompts(cfg)
    rng = random.Random(cfg.seed + 1)  # the arrivals: the same for every router
    choice_rng = random.Random(cfg.seed + 2)
    engines = [Engine(cfg, i) for i in range(cfg.replicas)]
    names = [f"r{i}" for i in range(cfg.replicas)]
    tree, policy, kv = PrefixTree(), PrefixPolicy(), KvIndex()
    for n in names:  # every engine publishes from the start
        kv.apply(n, 0, Batch(0.0, [], 0), now=0.0)
    seqs = {n: 0 for n in names}
    in_flight = [0] * cfg.replicas
    scraped = [0.0] * cfg.replicas
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
            calls.append(Call(cid, rng.choice(prompts), t, stage))
            cid += 1
    horizon = t
    order = 0

    def push(at: float, kind: str, payload) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, payload))

    for c in calls:
        push(c.arrived, "arrive", c)
    s = 0.0
    while s < horizon:
        push(s, "scrape", None)
        s += cfg.scrape_s
    samples: list[tuple[int, float, float]] = []  # (stage, waiting per replica, kv usage)

    def publish(e: Engine, at: float, stored: list[int], evicted: list[int]) -> None:
        evs = [block_stored(stored, None, [], cfg.block_tokens)]
        if evicted:
            evs.append(block_removed(evicted))
        push(at + cfg.event_lag_s, "kv", (names[e.index], Batch(at, evs, 0)))

    def admit(e: Engine, c: Call, now: float) -> None:
        hit, evicted = e.lookup_insert(c.prompt.blocks)
        publish(e, now, c.prompt.blocks, evicted)
        c.hit_tokens = min(c.prompt.tokens, hit * cfg.block_tokens)
        start = max(now, e.prefill_free_at)
        e.prefill_free_at = start + (c.prompt.tokens - c.hit_tokens) / cfg.prefill_tps
        c.first_token = e.prefill_free_at
        e.running[c.id] = c.prompt.blocks
        for h in c.prompt.blocks:
            e.in_use[h] = e.in_use.get(h, 0) + 1
        push(c.first_token + cfg.output_tokens / cfg.decode_tps, "finish", c)

    def pick(c: Call, now: float) -> int:
        cands = [Candidate(names[i], scraped[i], in_flight[i]) for i in range(cfg.replicas)]
        if router == "random":
            return choice_rng.randrange(cfg.replicas)
        if router == "least_queue":
            least = min(in_flight)
            return choice_rng.choice([i for i in range(cfg.replicas) if in_flight[i] == least])
        if router == "approximate":
            d = choose(cands, c.prompt.chunks, tree, policy)
            tree.record(c.prompt.chunks, d.chosen)
            return names.index(d.chosen)
        if router == "precise":
            matched = kv.match(c.prompt.blocks, names)
        else:  # oracle: every engine's cache as it is now
            matched = {names[i]: engines[i].held(c.prompt.blocks) for i in range(cfg.replicas)}
        d = choose_precise(cands, matched, len(c.prompt.blocks), policy=policy, rng=choice_rng)
        return names.index(d.chosen)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            c = payload
            i = pick(c, now)
            c.replica = i
            in_flight[i] += 1
            e = engines[i]
            if not e.waiting and e.fits(c.prompt.blocks):
                admit(e, c, now)
            else:
                e.waiting.append(c)  # first come, first served: nothing passes the head
            usage = sum((len(x.in_use) + x.out_blocks() * len(x.running)) / cfg.cache_blocks for x in engines)
            usage /= cfg.replicas
            samples.append((c.stage, sum(len(x.waiting) for x in engines) / cfg.replicas, min(usage, 1.0)))
        elif kind == "finish":
            c = payload
            c.done = now
            e = engines[c.replica]
            in_flight[c.replica] -= 1
            for h in e.running.pop(c.id):
                left = e.in_use[h] - 1
                if left:
                    e.in_use[h] = left
                else:
                    del e.in_use[h]
            while e.waiting and e.fits(e.waiting[0].prompt.blocks):
                admit(e, e.waiting.popleft(), now)
        elif kind == "scrape":
            for i, e in enumerate(engines):
                scraped[i] = float(len(e.waiting))
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
