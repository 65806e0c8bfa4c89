"""Precise prefix routing (gateway/replica_router.apick + router_gate.choose_gated): the KV
index's matched blocks against token load read at decision time (calls chosen but not started
count), randomized ties, the hotspot guard over a 64-call burst sharing one prefix, the fallback
for blind replicas and untokenizable requests, and explain's per-replica rows."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

from common.kv_events import BlockHasher, decode_batch, encode_batch
from common.kv_events import block_stored as stored
from common.kv_index import KvIndex
from common.schemas import EndpointStatus, InferenceEndpoint, Replica
from gateway.engine_hash import RequestHasher, SimTokenizer
from gateway.replica_router import ReplicaRouter
from gateway.upstreams import EndpointView, UpstreamCache

SYSTEM = "You are the support assistant of a large shop. Answer briefly. " * 12


def _view(n: int) -> EndpointView:
    ep = InferenceEndpoint(name="e", deployment="d", routing_l7="prefix", status=EndpointStatus())
    reps = tuple(Replica(replica_id=f"r{i}", deployment="d", ordinal=i, node="n", host=f"10.0.0.{i + 1}",
                         ready=True) for i in range(n))
    return EndpointView(ep, reps, {})


class FakeKv:
    """The agents' index as a gateway reads it (here: one KvIndex in memory)."""

    def __init__(self, index: KvIndex, hasher: RequestHasher | None):
        self.index, self._hasher, self.calls = index, hasher, 0

    async def hasher(self, view):
        return self._hasher

    async def match(self, view, hashes):
        self.calls += 1
        return self.index.match(hashes, [r.replica_id for r in view.replicas])


def _req(q: str) -> dict:
    return {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}


def _index_holding(replica_blocks: dict[str, list[int]], live: list[str]) -> KvIndex:
    idx = KvIndex()
    for r in live:
        idx.apply(r, 0, decode_batch(encode_batch([stored(replica_blocks.get(r, []), None, [], 16)])))
    return idx


def test_a_burst_of_64_sharing_one_prefix_spreads_as_the_load_guard_says():
    hasher = RequestHasher(SimTokenizer())
    blocks = hasher.request_hashes(_req("q"))
    assert len(blocks) >= 10
    replicas = [f"r{i}" for i in range(4)]
    kv = FakeKv(_index_holding({"r2": blocks}, replicas), hasher)  # r2 holds the shared prefix
    router = ReplicaRouter(kv=kv, _rng=random.Random(7))
    view = _view(4)
    chosen = []
    for i in range(64):  # none of them has started when the next is chosen
        before = {c.replica: c.in_flight for c in router.candidates(view, 0.0)}
        picked, why = asyncio.run(router.apick(view, _req(f"question {i}"), 0.0))
        assert why["kv_index"] == "precise" and why["blind_replicas"] == []
        # the guard's promise, at every decision: never onto a replica with 1.5x the mean calls
        # and 4 more than the least busy
        assert before[picked] < max(1.5 * (sum(before.values()) + 1) / 4, 1.0) or before[picked] - min(before.values()) < 4
        chosen.append((picked, why["load_tokens"]))
    counts = Counter(r for r, _ in chosen)
    assert set(counts) == set(replicas)  # spread over all four
    assert counts["r2"] == max(counts.values())  # the one holding the prefix takes the most
    assert 4 * counts["r2"] / 64 <= 1.5 + 4 / 64  # hotspot index
    assert sum(router.pending(r) for r in replicas) == 64
    for r, tokens in chosen:
        router.started(r, tokens)
    assert sum(router.pending(r) for r in replicas) == 0
    assert sum(c.in_flight for c in router.candidates(view, 0.0)) == 64
    loads = {c.replica: c.prefill_tokens for c in router.candidates(view, 0.0)}
    assert loads == {r: sum(t for x, t in chosen if x == r) for r in replicas}  # token load, from the calls
    for r, tokens in chosen:
        router.finished(r, tokens)
    assert all(c.prefill_tokens == 0 and c.in_flight == 0 for c in router.candidates(view, 0.0))


def test_explain_shows_each_replicas_matched_blocks_load_and_score():
    hasher = RequestHasher(SimTokenizer())
    blocks = hasher.request_hashes(_req("q"))
    kv = FakeKv(_index_holding({"r0": blocks[:10], "r1": blocks}, ["r0", "r1"]), hasher)  # r2: blind
    router = ReplicaRouter(kv=kv)
    picked, why = asyncio.run(router.apick(_view(3), _req("q"), 0.0))
    assert picked == "r1" and why["reason"] == "sticky" and why["blind_replicas"] == ["r2"]
    rows = {r["replica"]: r for r in why["scores"]}
    assert rows["r1"]["matched_blocks"] == len(blocks) == why["prompt_blocks"]
    assert rows["r0"]["matched_blocks"] == 10 and rows["r2"]["matched_blocks"] is None and rows["r2"]["blind"]
    assert all({"cost_tokens", "matched_tokens", "prefill_tokens", "in_flight"} <= set(r) for r in rows.values())
    assert rows["r1"]["cost_tokens"] < rows["r0"]["cost_tokens"] < rows["r2"]["cost_tokens"]
    assert why["tau_tokens"] == router.policy.tau and why["load_tokens"] == rows["r1"]["cost_tokens"]


def test_the_agents_evicting_flags_reach_the_gate():
    class Evicting(FakeKv):  # the agents' answer: whether each replica's engine evicted lately
        flags: dict = {}

        def evicting(self, view):
            return {r.replica_id: self.flags.get(r.replica_id) for r in view.replicas}

    hasher = RequestHasher(SimTokenizer())
    blocks = hasher.request_hashes(_req("q"))

    def pick(flags: dict) -> tuple[str, dict]:
        kv = Evicting(_index_holding({"r0": blocks}, ["r0", "r1"]), hasher)  # r0 holds the prompt, r1 is live
        kv.flags = flags
        router = ReplicaRouter(kv=kv, _rng=random.Random(0))
        for _ in range(2):  # r0 took the last two calls; both idle now
            router._recent.add("r0", time.monotonic())
        return asyncio.run(router.apick(_view(2), _req("q"), 0.0))

    chosen, why = pick({"r0": True, "r1": False})  # r1's cache evicts nothing: the copy displaces no prefix
    assert (chosen, why["reason"]) == ("r1", "spread")
    assert {r["replica"]: r["evicting"] for r in why["scores"]} == {"r0": True, "r1": False}
    for flags in ({"r0": True, "r1": True}, {}):  # r1 evicting, or not known: a whole prompt's copy is not worth it
        chosen, why = pick(flags)
        assert (chosen, why["reason"]) == ("r0", "sticky")
    assert {r["replica"]: r["evicting"] for r in why["scores"]} == {"r0": None, "r1": None}


def test_untokenizable_requests_and_a_silent_index_route_approximately():
    class Down(FakeKv):
        async def match(self, view, hashes):
            raise OSError("agent unreachable")

    hasher = RequestHasher(SimTokenizer())
    router = ReplicaRouter(kv=FakeKv(KvIndex(), hasher))
    image = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    _, why = asyncio.run(router.apick(_view(2), image, 0.0))
    assert why["kv_index"].startswith("approximate: the request cannot be tokenized")
    _, why = asyncio.run(ReplicaRouter(kv=FakeKv(KvIndex(), None)).apick(_view(2), _req("q"), 0.0))
    assert why["kv_index"] == "approximate: no tokenizer for this model"
    _, why = asyncio.run(ReplicaRouter(kv=Down(KvIndex(), hasher)).apick(_view(2), _req("q"), 0.0))
    assert why["kv_index"] == "approximate: the KV index did not answer (OSError)"


def test_a_blind_replica_is_scored_by_the_approximate_tree():
    hasher = RequestHasher(SimTokenizer())
    router = ReplicaRouter(kv=FakeKv(KvIndex(), hasher), _rng=random.Random(1))
    view = _view(2)
    first, _ = asyncio.run(router.apick(view, _req("a"), 0.0))  # both blind: the tree learns the choice
    router.started(first)
    router.finished(first)
    again, why = asyncio.run(router.apick(view, _req("b"), 0.0))
    assert again == first and why["reason"] == "sticky" and why["blind_replicas"] == ["r0", "r1"]
    assert {r["replica"]: r["approx_chunks"] for r in why["scores"]}[first] > 0


def test_ties_are_drawn_at_random_and_idle_replicas_are_preferred():
    hasher = RequestHasher(SimTokenizer())
    picks = set()
    for seed in range(40):
        router = ReplicaRouter(kv=FakeKv(_index_holding({}, ["r0", "r1", "r2", "r3"]), hasher), _rng=random.Random(seed))
        picks.add(asyncio.run(router.apick(_view(4), _req("q"), 0.0))[0])
    assert len(picks) == 4  # no fixed order to pile onto
    router = ReplicaRouter(kv=FakeKv(_index_holding({}, ["r0", "r1"]), hasher), _rng=random.Random(0))
    router.started("r0")  # a call with no prompt tokens: equal token cost, one more call on r0
    assert {asyncio.run(router.apick(_view(2), _req(f"q{i}"), 0.0))[0] for i in range(1)} == {"r1"}


def test_lora_and_salt_change_the_hashes():
    h = RequestHasher(SimTokenizer(), BlockHasher(16), lora_paths=(("sql", "/adapters/sql"),))
    base = h.request_hashes(_req("q"))
    assert h.request_hashes({**_req("q"), "model": "sql"})[1] != base[1]  # every block of a LoRA request
    salted = h.request_hashes({**_req("q"), "cache_salt": "t1"})
    assert salted[0] != base[0]


def test_the_agent_source_asks_each_node_once_and_learns_the_block_size(tmp_path):
    import httpx
    from fastapi import FastAPI

    from agent.kv_index.routes import kv_index_router
    from common import keyspace
    from common.schemas import Node
    from common.store.connect import open_store

    class Sub:  # the agent's subscriber, as the route reads it
        def __init__(self, index):
            self.index = index

        def match(self, hashes, replicas):
            return self.index.match(hashes, replicas)

        def block_sizes(self, replicas):
            return {r: 16 for r in replicas}

        def states(self, replicas, blind_after_s):
            return {r: "unwatched" if r not in self.index.replicas else "live" for r in replicas}

        def evicting(self, replicas, window_s):
            return {r: r == "r1" if r in self.index.replicas else None for r in replicas}

    from gateway.kv_source import AgentKvSource

    hasher = RequestHasher(SimTokenizer())
    blocks = hasher.request_hashes(_req("q"))
    app = FastAPI()
    app.include_router(kv_index_router(Sub(_index_holding({"r1": blocks[:5]}, ["r0", "r1"]))))
    seen = []

    async def handler_app(scope, receive, send):
        if scope["type"] == "http":
            seen.append(scope["path"])
        await app(scope, receive, send)

    store = open_store(f"sqlite://{tmp_path}/s.db")
    store.put(keyspace.nodes("n"), Node(id="n", address="http://agent-n:9000").model_dump_json())
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "d.sim").write_text("")
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=handler_app))
    src = AgentKvSource(UpstreamCache(store, ttl_secs=0), client, tmp_path / "tok", timeout_s=5)
    view = _view(3)
    assert asyncio.run(src.hasher(view)).request_hashes(_req("q")) == blocks
    got = asyncio.run(src.match(view, blocks))
    assert got == {"r0": 0, "r1": 5, "r2": None} and seen == ["/v1/kv-index/match"]  # one call per node
    assert src._block_size == {"d": 16}
    assert src.evicting(view) == {"r0": False, "r1": True, "r2": None}  # the same answer's, for the gate
    assert asyncio.run(AgentKvSource(UpstreamCache(store, ttl_secs=0), client, tmp_path / "none").hasher(view)) is None  # no model record
    store.close()
