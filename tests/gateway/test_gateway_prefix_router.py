"""Planner tests for gateway.prefix_router: chunking, the scorer, the imbalance guard, bounds."""

from __future__ import annotations

from gateway.prefix_router import (
    Candidate,
    PrefixPolicy,
    PrefixTree,
    choose,
    chunk_hashes,
    imbalanced,
    render_prompt,
)

SYSTEM = "You are a support agent for ACME. Answer briefly and cite the manual. " * 8


def chat(system: str, user: str) -> list[bytes]:
    return chunk_hashes(render_prompt({"messages": [{"role": "system", "content": system},
                                                    {"role": "user", "content": user}]}))


def idle(*names: str) -> list[Candidate]:
    return [Candidate(n, 0.0, 0) for n in names]


def test_chunks_are_chained_so_only_a_shared_leading_prefix_matches():
    a, b = chat(SYSTEM, "one"), chat(SYSTEM, "two")
    assert len(a) >= 8 and a[:8] == b[:8]
    assert chunk_hashes("x" + render_prompt({"messages": [{"role": "system", "content": SYSTEM}]}))[0] != a[0]
    assert chunk_hashes("short") == []  # no full chunk: nothing an engine would cache
    assert render_prompt({"prompt": "p" * 10}) == "p" * 10
    assert len(chunk_hashes("y" * 10**6)) == 256  # bounded work per call


def test_affinity_follows_the_replica_that_served_the_prefix():
    tree = PrefixTree()
    first = choose(idle("r0", "r1", "r2"), chat(SYSTEM, "hello"), tree)
    assert first.reason == "hash"
    tree.record(chat(SYSTEM, "hello"), first.chosen)
    again = choose(idle("r0", "r1", "r2"), chat(SYSTEM, "another question"), tree)
    assert again.chosen == first.chosen and again.reason == "affinity"
    assert {s["replica"]: s["matched_chunks"] for s in again.scores}[first.chosen] >= 8


def test_load_outvotes_affinity_and_the_guard_needs_both_gaps():
    tree = PrefixTree()
    h = chat(SYSTEM, "q")
    tree.record(h, "r0")
    # r0 a little busier: affinity still wins (score: ~0.9 match vs 0.1 per request).
    d = choose([Candidate("r0", 2, 1), Candidate("r1", 0, 0)], h, tree)
    assert d.chosen == "r0" and d.reason == "affinity"
    # Much busier: the load term outvotes the match.
    d = choose([Candidate("r0", 12, 0), Candidate("r1", 0, 0)], h, tree, PrefixPolicy(abs_gap=100))
    assert d.chosen == "r1" and d.reason == "load"
    # The guard: both an absolute and a relative gap.
    policy = PrefixPolicy(load_weight=0.0, abs_gap=4, rel_gap=2.0)
    assert imbalanced(5, 1, policy) and not imbalanced(5, 2, policy)
    assert not imbalanced(20, 17, policy)  # absolute gap 3 < 4
    assert not imbalanced(30, 20, policy)  # absolute 10 but 1.5x < 2x
    assert choose([Candidate("r0", 30, 0), Candidate("r1", 20, 0)], h, tree, policy).chosen == "r0"
    guarded = choose([Candidate("r0", 9, 0), Candidate("r1", 3, 0)], h, tree, policy)
    assert guarded.chosen == "r1" and guarded.reason == "imbalance_guard"


def test_hit_counts_keep_a_randomly_spread_prefix_on_its_main_replica():
    tree = PrefixTree()
    h = chat(SYSTEM, "q")
    for replica in ("r0", "r0", "r0", "r1"):
        tree.record(h, replica)
    assert choose(idle("r0", "r1", "r2"), h, tree).chosen == "r0"


def test_the_tree_and_each_node_are_bounded_and_evict_least_recent_leaves_first():
    tree = PrefixTree(max_nodes=20, max_replicas_per_node=2)
    old = chat(SYSTEM, "old")
    tree.record(old, "r0")
    for i in range(10):
        tree.record(chat(f"tenant {i} " * 40, "x"), "r1")
        assert len(tree) <= 20
    assert tree.match(old) == {}  # pushed out by newer prefixes
    h = chat(SYSTEM, "q")
    tree = PrefixTree(max_nodes=1000, max_replicas_per_node=2)
    for replica in ("r0", "r0", "r1", "r2"):
        tree.record(h, replica)
    assert set(tree.match(h)) == {"r0", "r2"}  # r1 (fewest hits) made room for the newcomer
    # Eviction takes leaves before their ancestors: the shared prefix survives longest.
    tree = PrefixTree(max_nodes=len(h) + 2)
    tree.record(h, "r0")
    tree.record(chat(SYSTEM, "a different and longer question " * 4), "r0")
    assert tree.match(h[:3]) and tree.match(h[:3])["r0"][0] == 3


def test_new_prefixes_spread_over_the_replicas_that_remember_least():
    tree = PrefixTree()
    placed = []
    for i in range(4):
        h = chat(f"system prompt {i} " * 30, "q")
        d = choose(idle("r0", "r1", "r2", "r3"), h, tree)
        tree.record(h, d.chosen)
        placed.append(d.chosen)
    assert sorted(placed) == ["r0", "r1", "r2", "r3"]
    assert all(tree.owned(r) > 0 for r in placed)
