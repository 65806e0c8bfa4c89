"""scripts/bench-router --workload profiles: the field's workload shapes run against the field's
routing baselines and Fabric's routers, in a seeded discrete-event simulation (simulated time;
one run gives the same tables on any machine, however loaded).

Profiles (token counts are the field's divided by ``scale``, 10 by default, shape kept):
- ``b2b_saas`` (llm-d's): 150 system prompts x 5 users; 6,000-token system prompt + 1,200-token
  question in, 1,000 out; single turn.
- ``codegen``: 8 long system prompts (8,000 tokens), conversations of 2-20 turns (user turns of
  400-2,000 tokens, answers of 1,500), 2 s between turns; each conversation carries a session key.
- ``agentic``: one shared system prompt (6,000 tokens) for every session, 3-12 turns, each turn a
  tool call (800 tokens out) answered by a tool output of 2,000-12,000 tokens; no session key.
- ``decode_bound``: 20 system prompts of 2,000 tokens + 500-token questions, 6,000 out.

Arrivals: Poisson stages of (calls/s, seconds); a multi-turn profile starts conversations at
rate / mean turns and sends each next turn ``think_s`` after the previous answer. A call that
waits longer than ``timeout_s`` for admission fails (success < 1).

Engine (each replica; calibration in ``EngineCalibration``): prefill on one serial lane at
``prefill_tps`` uncached tokens/s; decode at a per-step time of ``step_base_s + step_per_seq_s *
batch`` per token (the batch counted when the sequence's first token comes); at most
``max_num_seqs`` running, and only while prompt + output blocks fit in ``cache_blocks``
(vLLM's admission, first come first served); a prefix cache of 16-token blocks, least recently
used unused blocks evicted; every store and eviction a KV event, applied ``event_lag_s`` later to
the index that the precise routers read (common/kv_index.KvIndex).

Routers:
- ``round_robin``: Kubernetes' Service.
- ``llmd``: llm-d's token-aware "sticky until saturated", from its published rule (not its code):
  warm = replicas holding >= ``affinity_threshold`` (0.8) of the prompt; the warm one with the
  least token load (uncached prompt tokens in flight) is kept unless its estimated TTFT exceeds
  the best cold one's by more than ``max_ttft_penalty_s``, i.e. unless (load + uncached) differs
  by more than tau = peak prefill throughput x max_ttft_penalty_s tokens; else least token load.
- ``session``: affinity on the true conversation id (an oracle session key), rendezvous hash.
- ``approximate`` / ``precise``: Fabric's prefix mode, the saturation gate
  (gateway/router_gate.choose_gated) with the gateway's token load (router_bench.GateLoad), tau
  the same as llmd's, conversations keyed by their own history (router_gate.conversation_key's
  rule); what each replica holds from the approximate tree or from the KV index.

Columns per stage: offered rate (the stage's nominal rate, and the calls that arrived in it per
second: a multi-turn profile's next turns wait for answers), achieved req/s, success, output and input tok/s, TTFT p50/p90/p99,
ITL (mean), hit rate (engines' hit tokens / prompt tokens), hotspot index (replicas x the busiest
replica's share of the stage's calls; 1 = even; ``hotspot_floor``: the least any router that keeps a
conversation on one replica can reach, from the stage's largest conversation and an even split), wait-queue mean (waiting per replica, sampled at
each arrival).
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import dataclass, replace

from common.kv_events import Batch, block_removed, block_stored
from common.kv_index import EVICT_WINDOW_S, KvIndex
from gateway.prefix_router import PrefixTree, deepest
from gateway.router_bench import Engine, GateLoad, _p
from gateway.router_gate import GatePolicy

ROUTERS = ("round_robin", "llmd", "session", "approximate", "precise")
GATED = ("approximate", "precise")
PROFILES = ("b2b_saas", "codegen", "agentic", "decode_bound")
BLOCK = 16


@dataclass(frozen=True)
class EngineCalibration:
    """The simulated engine's rates. Decode: the lab's real vLLM CPU engine as measured by
    scripts/bench-engine (docs/runtimes.md: 371 tok/s for 1 client, 958 for 4 -> a step of
    2.20 ms + 0.49 ms per running sequence). Prefill: 8,000 uncached tokens/s, assumed (the
    shared_prefix bench's rate and the gate's default); scripts/bench-prefill measured the same
    engine and model at 39,500 (scripts/bench-router --prefill-tps runs with another)."""
    prefill_tps: float = 8000.0
    step_base_s: float = 0.00220
    step_per_seq_s: float = 0.00049
    max_num_seqs: int = 32
    cache_blocks: int = 2000


@dataclass(frozen=True)
class Profile:
    name: str
    systems: int
    users: int  # b2b: users per system prompt (each call a fresh question)
    system_tokens: int
    user_tokens: tuple[int, int]
    output_tokens: int
    turns: tuple[int, int] = (1, 1)
    tool_tokens: tuple[int, int] = (0, 0)  # agentic: a tool output follows every answer
    think_s: float = 0.0
    session_header: bool = True  # whether clients send a session key (the oracle router reads it anyway)
    llmd_load: str = "tokens"  # llm-d's recipe picks the load signal per bottleneck: tokens | requests
    stages: tuple[tuple[float, float], ...] = ((10.0, 15.0), (20.0, 15.0), (40.0, 15.0), (60.0, 15.0),
                                               (90.0, 15.0), (120.0, 15.0))


def profile(name: str, scale: int = 10) -> Profile:
    s = max(scale, 1)
    if name == "b2b_saas":
        return Profile(name, 150, 5, 6000 // s, (1200 // s, 1200 // s), 1000 // s)
    if name == "codegen":
        return Profile(name, 8, 1, 8000 // s, (400 // s, 2000 // s), 1500 // s, (2, 20), think_s=2.0,
                       stages=((2.0, 15.0), (4.0, 15.0), (8.0, 15.0), (12.0, 15.0), (16.0, 15.0), (24.0, 15.0)))
    if name == "agentic":
        return Profile(name, 1, 1, 6000 // s, (200 // s, 600 // s), 800 // s, (3, 12),
                       tool_tokens=(2000 // s, 12000 // s), think_s=0.5, session_header=False,
                       stages=((4.0, 15.0), (8.0, 15.0), (16.0, 15.0), (24.0, 15.0), (32.0, 15.0), (48.0, 15.0)))
    if name == "decode_bound":
        return Profile(name, 20, 1, 2000 // s, (500 // s, 500 // s), 6000 // s, llmd_load="requests",
                       stages=((2.0, 15.0), (4.0, 15.0), (8.0, 15.0), (12.0, 15.0), (16.0, 15.0)))
    raise ValueError(f"profile must be one of {', '.join(PROFILES)}")


@dataclass(frozen=True)
class BenchConfig:
    profile: Profile
    replicas: int = 4
    engine: EngineCalibration = EngineCalibration()
    affinity_threshold: float = 0.8
    max_ttft_penalty_s: float = 0.5
    event_lag_s: float = 0.05
    timeout_s: float = 30.0
    evict_window_s: float = EVICT_WINDOW_S  # precise: a replica whose KV events reported an eviction this recently is evicting
    seed: int = 0


def _h(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


def blocks_of(segments: list[tuple[int, int]]) -> list[int]:
    """Chained block hashes of a token sequence given as (segment id, tokens) runs: one hash per
    full 16-token block, chained over every block before it (as the engine's)."""
    out, parent, cur, fill = [], 0, [], 0
    for seg, n in segments:
        off = 0
        while off < n:
            take = min(n - off, BLOCK - fill)
            cur.append((seg, off, take))
            fill += take
            off += take
            if fill == BLOCK:
                parent = _h(parent, tuple(cur))
                out.append(parent)
                cur, fill = [], 0
    return out


@dataclass
class Conv:
    id: int
    key: str  # the true session id (the oracle's)
    inferred: str  # conversation_key's rule: the system prompt and the first user turn
    segments: list
    turns: int
    done_turns: int = 0


@dataclass
class Call:
    id: int
    conv: Conv
    blocks: list[int]
    tokens: int
    out: int
    arrived: float
    stage: int
    replica: int = -1
    first: float | None = None
    done: float | None = None
    failed: bool = False
    hit: int = 0
    uncached_est: int = 0


def _rendezvous(key: str, replica: int) -> int:
    return _h(key, replica)


def simulate(cfg: BenchConfig, router: str) -> dict:
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}")
    p, e = cfg.profile, cfg.engine
    n = cfg.replicas
    wl = random.Random(cfg.seed)  # the workload: the same for every router
    choice_rng = random.Random(cfg.seed + 2)
    engines = [Engine(e.cache_blocks, e.max_num_seqs, BLOCK) for _ in range(n)]
    names = [f"r{i}" for i in range(n)]
    kv, tree, gate = KvIndex(), PrefixTree(), GateLoad(n)
    gate_policy = GatePolicy(peak_prefill_tps=e.prefill_tps, max_ttft_penalty_s=cfg.max_ttft_penalty_s)
    for name in names:
        kv.apply(name, 0, Batch(0.0, [], 0), now=0.0)
    seqs = {name: 0 for name in names}
    in_flight = [0] * n
    prefill_tokens = [0.0] * n  # llmd's token-load view
    homes: dict[str, int] = {}
    rr = 0
    events: list = []
    order = 0

    def push(at: float, kind: str, payload) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (at, order, kind, payload))

    horizon = sum(secs for _, secs in p.stages)
    stage_start = [sum(secs for _, secs in p.stages[:k]) for k in range(len(p.stages))]

    def stage_of(t: float) -> int:
        k = 0
        while k + 1 < len(stage_start) and t >= stage_start[k + 1]:
            k += 1
        return k

    mean_turns = (p.turns[0] + p.turns[1]) / 2
    t, conv_id = 0.0, 0
    for rate, secs in p.stages:
        end = t + secs
        while True:
            t += wl.expovariate(rate / mean_turns)
            if t >= end:
                t = end
                break
            system = wl.randrange(p.systems)
            turns = wl.randint(*p.turns)
            first_user = (conv_id, 0, "user")
            conv = Conv(conv_id, f"s{conv_id}", f"{system}/{first_user}", [(_h("sys", system), p.system_tokens)],
                        turns)
            push(t, "turn", conv)
            conv_id += 1

    calls: list[Call] = []
    samples: list[tuple[int, float]] = []

    def next_turn(conv: Conv, now: float) -> None:
        k = conv.done_turns
        if k:
            conv.segments.append((_h("asst", conv.id, k - 1), p.output_tokens))
            if p.tool_tokens[1]:
                conv.segments.append((_h("tool", conv.id, k - 1), wl.randint(*p.tool_tokens)))
        if k == 0 or not p.tool_tokens[1]:
            conv.segments.append((_h("user", conv.id, k), wl.randint(*p.user_tokens)))
        tokens = sum(x for _, x in conv.segments)
        c = Call(len(calls), conv, blocks_of(conv.segments), tokens, p.output_tokens, now, stage_of(now))
        calls.append(c)
        route(c, now)

    def publish(i: int, at: float, stored: list[int], evicted: list[int]) -> None:
        evs = [block_stored(stored, None, [], BLOCK)]
        if evicted:
            evs.append(block_removed(evicted))
        push(at + cfg.event_lag_s, "kv", (names[i], Batch(at, evs, 0)))

    def start(i: int, c: Call, now: float) -> None:
        eng = engines[i]
        hit, evicted = eng.admit(c)
        publish(i, now, c.blocks, evicted)
        c.hit = min(c.tokens, hit * BLOCK)
        begin = max(now, eng.prefill_free_at)
        eng.prefill_free_at = begin + (c.tokens - c.hit) / e.prefill_tps
        c.first = eng.prefill_free_at
        push(c.first, "first", c)

    def pick(c: Call, now: float) -> int:
        nonlocal rr
        if router == "round_robin":
            rr += 1
            return (rr - 1) % n
        if router == "session":
            return max(range(n), key=lambda i: _rendezvous(c.conv.key, i))
        chunks = [b.to_bytes(8, "big") for b in c.blocks[:256]]
        if router == "approximate":
            held = [tree.match(chunks).get(names[i], (0, 0))[0] for i in range(n)]
        else:
            matched = kv.match(c.blocks, names)
            held = [int(matched.get(names[i]) or 0) for i in range(n)]
        if router == "llmd":
            return llmd_pick(held, c)
        home = homes.get(c.conv.inferred)
        evicting = None
        if router == "precise":  # what the agents' index answers (KvIndex.evicting), from the events it applied
            flags = kv.evicting(names, cfg.evict_window_s, now)
            evicting = [bool(flags[name]) for name in names]
        history = deepest(tree.match(chunks)) if router == "precise" else None  # when no replica holds any
        i, c.uncached_est = gate.pick([min(h * BLOCK, c.tokens) for h in held], c.tokens, home, gate_policy,
                                      choice_rng, now, evicting, history)
        if router in GATED:
            tree.record(chunks, names[i])
        return i

    def llmd_pick(held: list[int], c: Call) -> int:
        nb = max(len(c.blocks), 1)
        uncached = [c.tokens - h * BLOCK for h in held]
        warm = [i for i in range(n) if held[i] / nb >= cfg.affinity_threshold]
        cold = [i for i in range(n) if i not in warm]

        load = prefill_tokens if p.llmd_load == "tokens" else in_flight

        def least(pool: list[int]) -> int:
            lo = min(load[i] for i in pool)
            return choice_rng.choice([i for i in pool if load[i] == lo])

        if not warm:
            return least(list(range(n)))
        w = least(warm)
        if not cold:
            return w
        k = least(cold)
        ttft_w = (prefill_tokens[w] + uncached[w]) / e.prefill_tps  # the recipe's TTFT estimate
        ttft_c = (prefill_tokens[k] + uncached[k]) / e.prefill_tps
        return k if ttft_w - ttft_c > cfg.max_ttft_penalty_s else w

    def route(c: Call, now: float) -> None:
        i = pick(c, now)
        c.replica = i
        homes[c.conv.inferred] = i
        if router == "llmd":  # its token load: uncached prompt tokens until the first token
            held = int(kv.match(c.blocks, [names[i]]).get(names[i]) or 0)
            c.uncached_est = max(c.tokens - held * BLOCK, 0)
            prefill_tokens[i] += c.uncached_est
        in_flight[i] += 1
        eng = engines[i]
        if not eng.waiting and eng.fits(c):
            start(i, c, now)
        else:
            eng.waiting.append(c)
            push(now + cfg.timeout_s, "timeout", c)
        samples.append((c.stage, sum(len(x.waiting) for x in engines) / n))

    def drain(i: int, now: float) -> None:
        eng = engines[i]
        while eng.waiting and eng.fits(eng.waiting[0]):
            start(i, eng.waiting.popleft(), now)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "turn":
            if now < horizon:
                next_turn(payload, now)
        elif kind == "first":
            c = payload
            i = c.replica
            if router == "llmd":
                prefill_tokens[i] -= c.uncached_est
            step = e.step_base_s + e.step_per_seq_s * len(engines[i].running)
            push(now + c.out * step, "finish", c)
        elif kind == "finish":
            c = payload
            c.done = now
            i = c.replica
            if router in GATED:
                gate.done(i, c.uncached_est)
            in_flight[i] -= 1
            engines[i].release(c)
            drain(i, now)
            c.conv.done_turns += 1
            if c.conv.done_turns < c.conv.turns:
                push(now + p.think_s, "turn", c.conv)
        elif kind == "timeout":
            c = payload
            eng = engines[c.replica]
            if c.first is None and c in eng.waiting:
                eng.waiting.remove(c)
                c.failed = True
                in_flight[c.replica] -= 1
                if router == "llmd":
                    prefill_tokens[c.replica] -= c.uncached_est
                elif router in GATED:
                    gate.done(c.replica, c.uncached_est)
                drain(c.replica, now)
        elif kind == "kv":
            name, batch = payload
            seqs[name] += 1
            kv.apply(name, seqs[name], batch, now=now)
    return summarize(cfg, calls, samples)


def summarize(cfg: BenchConfig, calls: list[Call], samples: list) -> dict:
    p, n = cfg.profile, cfg.replicas
    stages = []
    for k, (rate, secs) in enumerate(p.stages):
        cs = [c for c in calls if c.stage == k]
        ok = [c for c in cs if not c.failed and c.done is not None and c.first is not None]
        t0 = sum(x for _, x in p.stages[:k])
        span = max(max((float(c.done or 0.0) for c in ok), default=t0 + secs) - t0, 1e-9)
        ttft = [float(c.first or 0.0) - c.arrived for c in ok]
        itl = [(float(c.done or 0.0) - float(c.first or 0.0)) / max(c.out - 1, 1) for c in ok]
        prompt = sum(c.tokens for c in cs if c.first is not None)
        per = [sum(1 for c in cs if c.replica == i) for i in range(n)]
        per_conv: dict[int, int] = {}  # a conversation's calls in the stage: one replica takes them all unless it moves
        for c in cs:
            per_conv[c.conv.id] = per_conv.get(c.conv.id, 0) + 1
        waits = [w for st, w in samples if st == k]
        stages.append({
            "offered_rate": rate, "offered_calls_s": round(len(cs) / secs, 2), "calls": len(cs), "achieved_req_s": round(len(ok) / span, 2),
            "success": round(len(ok) / len(cs), 4) if cs else 1.0,
            "output_tok_s": round(sum(c.out for c in ok) / span, 1),
            "input_tok_s": round(sum(c.tokens for c in ok) / span, 1),
            "ttft_p50_s": round(_p(ttft, 0.5), 3), "ttft_p90_s": round(_p(ttft, 0.9), 3),
            "ttft_p99_s": round(_p(ttft, 0.99), 3),
            "itl_ms": round(1000 * sum(itl) / len(itl), 2) if itl else 0.0,
            "hit_rate": round(sum(c.hit for c in cs if c.first is not None) / prompt, 4) if prompt else 0.0,
            "hotspot_index": round(n * max(per) / len(cs), 3) if cs else 1.0,
            "hotspot_floor": round(n * max(max(per_conv.values()), -(-len(cs) // n)) / len(cs), 3) if cs else 1.0,
            "wait_queue_mean": round(sum(waits) / len(waits), 2) if waits else 0.0,
            "calls_per_replica": per,
        })
    return {"stages": stages}


def knee(stages: list[dict]) -> int:
    """The baseline's knee: the stage of its highest output tok/s (past it, more offered load
    brings it less)."""
    return max(range(len(stages)), key=lambda i: stages[i]["output_tok_s"])


def run_profile(cfg: BenchConfig, routers: tuple[str, ...] = ROUTERS) -> dict:
    rows = {r: simulate(cfg, r)["stages"] for r in routers}
    out: dict = {"profile": cfg.profile.name, "rows": rows}
    if {"llmd", "precise", "session"} <= set(rows):
        b, g = rows["llmd"], rows["precise"]
        k = knee(b)
        tok_ratio = g[k]["output_tok_s"] / b[k]["output_tok_s"] if b[k]["output_tok_s"] else None
        hit_gap = 100 * (rows["session"][k]["hit_rate"] - g[k]["hit_rate"])
        out["knee_stage"] = k
        out["targets"] = {
            "precise_over_llmd_output_tok_s": round(tok_ratio, 3) if tok_ratio is not None else None,
            "precise_over_llmd_output_tok_s_per_stage": [round(x["output_tok_s"] / y["output_tok_s"], 3)
                                                      if y["output_tok_s"] else None for x, y in zip(g, b)],
            "output_tok_s_at_least_1_1x_llmd": bool(tok_ratio is not None and tok_ratio >= 1.1),
            "precise_ttft_p90_s": g[k]["ttft_p90_s"], "llmd_ttft_p90_s": b[k]["ttft_p90_s"],
            "ttft_p90_no_worse": g[k]["ttft_p90_s"] <= b[k]["ttft_p90_s"] * 1.0001,
            "precise_hotspot_max": max(s["hotspot_index"] for s in g),
            "hotspot_at_most_1_5_every_stage": max(s["hotspot_index"] for s in g) <= 1.5,
            "session_minus_precise_hit_rate_points": round(hit_gap, 2),
            "hit_rate_within_5_points_of_session_oracle": hit_gap <= 5.0,
        }
    return out


def run(profiles: tuple[str, ...] = PROFILES, scale: int = 10, seed: int = 0, replicas: int = 4,
        routers: tuple[str, ...] = ROUTERS, stage_secs: float | None = None, **engine) -> dict:
    out: dict = {"calibration": " ".join((EngineCalibration.__doc__ or "").split()), "scale": scale, "seed": seed,
           "replicas": replicas, "profiles": {}}
    for name in profiles:
        prof = profile(name, scale)
        if stage_secs is not None:
            prof = replace(prof, stages=tuple((r, stage_secs) for r, _ in prof.stages))
        cfg = BenchConfig(prof, replicas, replace(EngineCalibration(), **engine), seed=seed)
        out["profiles"][name] = run_profile(cfg, routers)
    return out
