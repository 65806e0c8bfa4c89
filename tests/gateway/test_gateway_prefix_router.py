"""Planner tests for gateway.prefix_router: chunking, hits per replica, bounds."""

from __future__ import annotations

from gateway.prefix_router import PrefixTree, chunk_hashes, render_prompt

SYSTEM = "You are a support agent for ACME. Answer briefly and cite the manual. " * 8


def chat(system: str, user: str) -> list[bytes]:
    return chunk_hashes(render_prompt({"messages": [{"role": "system", "content": system},
                                                    {"role": "user", "content": user}]}))


def test_chunks_are_chained_so_only_a_shared_leading_prefix_matches():
    a, b = chat(SYSTEM, "one"), chat(SYSTEM, "two")
    assert len(a) >= 8 and a[:8] == b[:8]
    assert chunk_hashes("x" + render_prompt({"messages": [{"role": "system", "content": SYSTEM}]}))[0] != a[0]
    assert chunk_hashes("short") == []  # no full chunk: nothing an engine would cache
    assert render_prompt({"prompt": "p" * 10}) == "p" * 10
    assert len(chunk_hashes("y" * 10**6)) == 256  # bounded work per call


def test_the_tree_counts_hits_per_replica_on_the_deepest_shared_chunk():
    tree = PrefixTree()
    h = chat(SYSTEM, "q")
    for replica in ("r0", "r0", "r0", "r1"):
        tree.record(h, replica)
    assert tree.match(h) == {"r0": (len(h), 3), "r1": (len(h), 1)}
    other = chat(SYSTEM, "another question entirely, long enough to fill chunks " * 3)
    shared = max(d for d, _ in tree.match(other).values())
    assert 8 <= shared < len(other)  # the system prompt's chunks only


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
