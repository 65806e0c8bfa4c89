"""The saturation gate (gateway/router_gate.py), keyless conversation keys in the affinity mode,
and a small seeded profile of each field workload (gateway/router_profiles.py; the full tables
come from scripts/bench-router --workload profiles)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from common.schemas import EndpointStatus, InferenceEndpoint
from gateway.prefix_router import PrefixTree, deepest
from gateway.replica_router import ReplicaRouter
from gateway.router_gate import GateCandidate, GatePolicy, Recent, choose_gated, conversation_key
from gateway.router_profiles import PROFILES, BenchConfig, profile, simulate
from gateway.upstreams import EndpointView, Replica, order_targets

SYSTEM = {"role": "system", "content": "You are the fleet's agent. Use the tools. " * 40}


def _view(n: int) -> EndpointView:
    ep = InferenceEndpoint(name="e", deployment="d", status=EndpointStatus())
    reps = tuple(Replica(replica_id=f"r{i}", deployment="d", ordinal=i, node="n", host=f"10.0.0.{i + 1}",
                         ready=True) for i in range(n))
    return EndpointView(ep, reps, {})


def _first_replica(view: EndpointView, session: str) -> str:
    return order_targets(view, session)[0]


def test_64_keyless_sessions_on_one_system_prompt_spread_and_each_keeps_its_replica():
    view = _view(4)
    sessions = [[SYSTEM, {"role": "user", "content": f"task {i}: fix the build of service {i * 7}"}] for i in range(64)]
    # the old key, the prompt's head, is one key for all 64: every session on one replica
    heads = {("<|system|>" + s[0]["content"])[:64] for s in sessions}
    assert len(heads) == 1
    keys = [conversation_key({"messages": s}) for s in sessions]
    assert len(set(keys)) == 64
    first = [_first_replica(view, k) for k in keys]
    counts = {r: first.count(r) for r in set(first)}
    assert len(counts) == 4 and 4 * max(counts.values()) / 64 <= 1.5  # hotspot index
    for i in (0, 17, 63):  # later turns (answers, tool outputs) keep the conversation's key and replica
        later = sessions[i] + [{"role": "assistant", "content": "calling make"},
                               {"role": "tool", "content": "error: missing header"},
                               {"role": "user", "content": "and now?"}]
        assert conversation_key({"messages": later}) == keys[i]
        assert _first_replica(view, conversation_key({"messages": later})) == first[i]


def test_conversation_key_needs_a_chat_with_a_user_turn():
    assert conversation_key(None) is None
    assert conversation_key({"prompt": "hello"}) is None
    assert conversation_key({"messages": [SYSTEM]}) is None
    assert conversation_key({"messages": [{"role": "assistant", "content": "hi"}]}) is None
    a = conversation_key({"messages": [SYSTEM, {"role": "user", "content": "x"}]})
    b = conversation_key({"messages": [{"role": "system", "content": "other"}, {"role": "user", "content": "x"}]})
    assert a and b and a != b  # the same first turn under another system prompt is another conversation


def test_the_gate_sticks_until_the_penalty_then_takes_the_cheapest():
    pol = GatePolicy(peak_prefill_tps=1000.0, max_ttft_penalty_s=1.0)  # tau = 1000 tokens
    rng = random.Random(0)
    warm = GateCandidate("a", matched_tokens=2000, prefill_tokens=900)
    cold = GateCandidate("b", matched_tokens=0)
    d = choose_gated([warm, cold], 2100, "a", pol, rng)  # costs 1000 vs 2100: sticky
    assert (d.chosen, d.reason) == ("a", "sticky")
    busy = replace(warm, prefill_tokens=3200)  # 3300 - 2100 > tau
    d = choose_gated([busy, cold], 2100, "a", pol, rng)
    assert (d.chosen, d.reason) == ("b", "saturated")
    # a 70% holder still sticks (no 0.8 threshold): its saved prefill counts in tokens
    part = GateCandidate("a", matched_tokens=1400)
    assert choose_gated([part, cold], 2000, "a", pol, rng).chosen == "a"


def test_a_new_conversation_on_a_shared_prefix_is_spread_by_the_hotspot_guard():
    rng = random.Random(0)
    cands = [GateCandidate("a", 1000, in_flight=6)] + [GateCandidate(r, 0, in_flight=1) for r in "bcd"]
    d = choose_gated(cands, 1040, None, GatePolicy(), rng)  # 6 >= 1.5 * 10 / 4 and 6 - 1 >= 4
    assert d.reason == "hotspot_guard" and d.chosen != "a"
    assert choose_gated(cands, 1040, "a", GatePolicy(), rng).chosen == "a"  # its own home stays
    near = [GateCandidate("a", 1000, in_flight=4)] + [GateCandidate(r, 0, in_flight=1) for r in "bcd"]
    assert choose_gated(near, 1040, None, GatePolicy(), rng).chosen == "a"  # 4 - 1 < hot_gap
    long = [GateCandidate("a", 10_000, in_flight=6)] + [GateCandidate(r, 0, in_flight=1) for r in "bcd"]
    d = choose_gated(long, 10_040, None, GatePolicy(), rng)  # moving costs 10,000 tokens more > tau 4,000
    assert (d.chosen, d.reason) == ("a", "sticky")
    # a prefix every replica holds (one shared system prompt): new conversations go to the idlest
    even = [GateCandidate("a", 1000, in_flight=1), GateCandidate("b", 1000, in_flight=0)]
    assert {choose_gated(even, 1040, None, GatePolicy(), random.Random(s)).chosen for s in range(20)} == {"b"}


def test_at_low_load_a_new_conversation_spreads_to_an_idle_quiet_replica_and_a_home_stays():
    rng = random.Random(0)
    holder = GateCandidate("a", 1000, recent=3.0)  # idle now, but took the last three calls
    quiet = GateCandidate("b", 600, recent=0.5)  # 3 >= 1.5 * 0.5 + 1
    d = choose_gated([holder, quiet], 1040, None, GatePolicy(), rng)
    assert (d.chosen, d.reason) == ("b", "spread")  # 400 tokens more prefill: under half the prompt
    cold = replace(quiet, matched_tokens=0)  # 1,000 more: most of the prompt copied into another cache
    assert choose_gated([holder, cold], 1040, None, GatePolicy(), rng).chosen == "a"
    busy = [holder, quiet, GateCandidate("c", 0, in_flight=1), GateCandidate("d", 0, in_flight=3)]
    assert choose_gated(busy, 1040, None, GatePolicy(), rng).chosen == "a"  # 4 calls in flight on 4: not low load
    assert choose_gated([holder, quiet], 1040, "a", GatePolicy(), rng).chosen == "a"  # a conversation's next turn
    assert choose_gated([holder, replace(quiet, recent=1.5)], 1040, None, GatePolicy(), rng).chosen == "a"  # 3 < 3.25
    assert choose_gated([holder, replace(cold, evicting=True)], 1040, None, GatePolicy(), rng).chosen == "a"


def test_a_new_conversation_spreads_to_an_idle_cache_that_evicts_nothing_for_up_to_tau():
    rng, policy = random.Random(0), GatePolicy(peak_prefill_tps=1000.0, max_ttft_penalty_s=1.0)  # tau 1,000
    holder = GateCandidate("a", 1000, recent=2.0)  # idle now; 2 < 1.5 * 1 + 1 would not spread by share
    roomy = GateCandidate("b", 0, recent=1.0, evicting=False)  # no eviction in its KV events lately
    d = choose_gated([holder, roomy], 1040, None, policy, rng)
    assert (d.chosen, d.reason) == ("b", "spread")  # the whole prompt copied: 1,000 tokens, tau
    assert choose_gated([holder, replace(roomy, evicting=None)], 1040, None, policy, rng).chosen == "a"  # not known
    assert choose_gated([holder, replace(roomy, evicting=True)], 1040, None, policy, rng).chosen == "a"
    assert choose_gated([replace(holder, matched_tokens=1001), roomy], 1040, None, policy, rng).chosen == "a"  # past tau
    assert choose_gated([holder, replace(roomy, recent=1.5)], 1040, None, policy, rng).chosen == "a"  # 2 < 1.5 + 1
    assert choose_gated([holder, roomy], 1040, "a", policy, rng).chosen == "a"  # a conversation's next turn stays
    r = Recent(10.0)
    r.add("a", 0.0)
    r.add("a", 10.0)
    assert r.value("a", 10.0) == 1.5 and r.value("a", 20.0) == 0.75 and r.value("b", 5.0) == 0.0
    with pytest.raises(ValueError):
        choose_gated([], 10)


def test_a_prefix_no_cache_holds_goes_back_where_it_was_sent_unless_that_costs_past_tau():
    policy = GatePolicy(peak_prefill_tps=1000.0, max_ttft_penalty_s=1.0)  # tau 1,000 tokens
    cold = [GateCandidate("a", 0, prefill_tokens=300, in_flight=2), GateCandidate("b", 0, in_flight=1)]
    d = choose_gated(cold, 1040, None, policy, random.Random(0), history="a")
    assert (d.chosen, d.reason, d.sticky, d.explain()["sticky_from"]) == ("a", "sticky", "a", "history")
    assert choose_gated(cold, 1040, None, policy, random.Random(0)).chosen == "b"  # without it: by load
    # a replica that holds any of the prompt is the sticky one, whatever the history says
    part = [replace(cold[0], prefill_tokens=0), replace(cold[1], matched_tokens=160)]
    d = choose_gated(part, 1040, None, policy, random.Random(0), history="a")
    assert (d.chosen, d.sticky_from) == ("b", "holder")
    # the history breaks as a holder does, past tau: 1,300 + 1,040 - 1,040 > 1,000
    far = [replace(cold[0], prefill_tokens=1300), cold[1]]
    assert choose_gated(far, 1040, None, policy, random.Random(0), history="a").reason == "saturated"
    # a history replica that is no candidate (gone from the view) is ignored; a home comes first
    assert choose_gated(cold, 1040, None, policy, random.Random(0), history="z").sticky is None
    d = choose_gated(cold, 1040, "b", policy, random.Random(0), history="a")
    assert (d.chosen, d.sticky_from) == ("b", "home")


def test_deepest_names_the_replica_sent_the_most_of_a_prefix_and_none_on_a_tie():
    tree = PrefixTree()
    shared, other = [b"s1", b"s2"], [b"s1", b"x2", b"x3"]
    assert deepest(tree.match(shared)) is None  # never sent
    tree.record(shared, "a")
    tree.record(shared, "b")
    assert deepest(tree.match(shared)) is None  # as deep, as many hits: a tie
    tree.record(shared, "b")
    assert deepest(tree.match(shared)) == "b"  # as deep, more hits
    tree.record(other, "a")
    assert deepest(tree.match(other)) == "a"  # deeper


def test_precise_routing_sends_a_prefix_no_engine_holds_back_to_the_replica_it_went_to():
    """The gateway's router (precise: the KV index answered 0 blocks everywhere) places the first
    call by load and records it; the next call of the same prefix, with every cache evicted, goes
    to the same replica and says why."""
    router = ReplicaRouter(_rng=random.Random(1))
    view = replace(_view(3), endpoint=InferenceEndpoint(name="e", deployment="d", routing_l7="prefix",
                                                        status=EndpointStatus()))
    data = {"messages": [SYSTEM, {"role": "user", "content": "summarise the incident"}]}
    none = {f"r{i}": 0 for i in range(3)}
    hashes = list(range(40))
    first, why = router.pick(view, data, 0.0, matched=none, block_hashes=hashes)
    assert why["kv_index"] == "precise" and why["sticky_from"] is None
    router.started(first, why["load_tokens"])
    router.finished(first, why["load_tokens"])  # nothing in flight: load alone would draw again
    chosen = set()
    for turn in range(6):
        other = {"messages": [SYSTEM, {"role": "user", "content": f"question {turn}"}]}
        picked, why = router.pick(view, other, 1.0 + turn, matched=none, block_hashes=hashes)
        router.started(picked, why["load_tokens"])
        router.finished(picked, why["load_tokens"])
        chosen.add(picked)
        assert why["sticky_from"] == "history" and why["reason"] in ("sticky", "spread")
    assert first in chosen and why["sticky"] == first


@pytest.mark.parametrize("name", PROFILES)
def test_each_profile_small_and_seeded(name):
    prof = profile(name, scale=20)
    rates = prof.stages
    prof = replace(prof, stages=((rates[1][0], 6.0), (rates[3][0], 6.0)))
    cfg = BenchConfig(prof, seed=3)
    rows = {r: simulate(cfg, r)["stages"] for r in ("round_robin", "llmd", "session", "precise")}
    assert rows["precise"] == simulate(cfg, "precise")["stages"]  # seeded: the same table again
    for r, stages in rows.items():
        assert all(s["calls"] > 0 and s["success"] == 1.0 for s in stages), r
    top = -1
    assert rows["precise"][top]["hit_rate"] >= rows["round_robin"][top]["hit_rate"]
    if name == "b2b_saas":  # hundreds of calls (a few long conversations per replica are lumpy)
        assert rows["precise"][top]["hotspot_index"] <= 1.5
    assert all(s["hotspot_floor"] <= s["hotspot_index"] for s in rows["session"])  # it never moves a conversation
    if name == "agentic":  # keyless: the conversation's own history finds its replica, spread evenly
        assert rows["session"][top]["hit_rate"] - rows["precise"][top]["hit_rate"] <= 0.05
        assert rows["precise"][top]["hotspot_index"] <= 1.5
