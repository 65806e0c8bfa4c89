"""scripts/bench-router --workload shared_prefix's logic (gateway/router_bench.py), on a small
seeded run: the same arrivals for every router, deterministic results, the engine model's
admission and eviction rules, and the ordering the bench exists to show (cache-aware routers hit
more than random; precise close to the oracle)."""

from __future__ import annotations

import pytest

from gateway.router_bench import ROUTERS, BenchConfig, Engine, make_prompts, run, simulate

SMALL = BenchConfig(replicas=2, groups=6, prompts_per_group=2, system_tokens=320, question_tokens=32,
                    output_tokens=8, stages=((4.0, 5.0), (12.0, 5.0)), cache_blocks=60, max_num_seqs=8,
                    prefill_tps=4000.0, decode_tps=80.0)


def test_every_router_sees_the_same_calls_and_a_run_repeats_exactly():
    out = run(SMALL)
    assert set(out["rows"]) == set(ROUTERS)
    calls = {r["calls"] for r in out["rows"].values()}
    assert len(calls) == 1 and calls.pop() > 20
    assert simulate(SMALL, "precise") == out["rows"]["precise"]
    assert {"output_tok_s", "requests_s", "ttft_p90_s", "ttft_mean_s", "wait_queue_mean", "kv_usage_mean",
            "hit_rate"} <= set(out["rows"]["random"])
    assert set(out["targets"]) == {"precise_tok_s_at_least_1_2x_approximate",
                                   "precise_ttft_p90_at_most_0_5x_approximate",
                                   "precise_hit_rate_within_5_points_of_oracle"}
    assert "inference-perf itself was not used" in out["generator"]


def test_cache_aware_routers_hit_more_and_precise_tracks_the_oracle():
    rows = run(SMALL)["rows"]
    assert rows["precise"]["hit_rate"] > rows["random"]["hit_rate"]
    assert rows["oracle"]["hit_rate"] > rows["random"]["hit_rate"]
    assert abs(rows["oracle"]["hit_rate"] - rows["precise"]["hit_rate"]) <= 0.1


def test_the_engine_admits_only_what_fits_and_never_evicts_blocks_in_use():
    from types import SimpleNamespace as Seq

    e = Engine(cache_blocks=30, max_num_seqs=4)
    a, b = Seq(id=1, blocks=list(range(1, 21)), out=16), Seq(id=2, blocks=list(range(100, 120)), out=16)
    assert e.fits(a)
    e.admit(a)
    assert not e.fits(b)  # 20 held + 1 output block + 20 new + 1 > 30
    hit, evicted = e.admit(Seq(id=3, blocks=b.blocks[:8], out=16))
    assert hit == 0 and not set(evicted) & set(a.blocks)  # what a running sequence holds stays
    e.release(a)
    assert e.held(a.blocks) > 0 and e.fits(b)  # released blocks stay cached, and evictable


def test_the_workload_has_the_shared_prefix_shape():
    prompts = make_prompts(SMALL)
    assert len(prompts) == SMALL.groups * SMALL.prompts_per_group
    first, second = prompts[0], prompts[1]  # one group: the system prompt's blocks are shared
    shared = SMALL.system_tokens // SMALL.block_tokens
    assert first.blocks[:shared] == second.blocks[:shared] and first.blocks[shared] != second.blocks[shared]
    assert prompts[2].blocks[0] != first.blocks[0]
    with pytest.raises(ValueError):
        simulate(SMALL, "nope")
