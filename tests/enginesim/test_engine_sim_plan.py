"""Pure parts of the engine sim: generation plans, timing, FIFO admission, outputs."""

from __future__ import annotations

import asyncio

import pytest

from enginesim.generation_plan import (
    MIN_SLEEP_S,
    PlanRejected,
    estimate_tokens,
    kv_usage,
    plan_generation,
    text_seed,
    token_delay,
)
from enginesim.scheduler import SeqScheduler
from enginesim.settings import EngineSettings
from enginesim.synthetic_output import embedding, encode_base64, generated_text, relevance_score


def cfg(**kw) -> EngineSettings:
    return EngineSettings(replica_id="r", **kw)


def test_prompt_tokens_are_about_four_chars_each():
    assert estimate_tokens("", 4) == 1
    assert estimate_tokens("abcd", 4) == 1
    assert estimate_tokens("abcde", 4) == 2
    assert estimate_tokens("x" * 400, 4) == 100


def test_max_tokens_cuts_with_length_and_absent_max_tokens_stops():
    plan = plan_generation(cfg(default_max_tokens=7), "hello", max_tokens=3)
    assert (plan.completion_tokens, plan.finish_reason) == (3, "length")
    plan = plan_generation(cfg(default_max_tokens=7), "hello", max_tokens=None)
    assert (plan.completion_tokens, plan.finish_reason) == (7, "stop")


def test_natural_length_stops_early_unless_ignore_eos():
    config = cfg(natural_length=4)
    plan = plan_generation(config, "some prompt", max_tokens=100)
    assert plan.finish_reason == "stop"
    assert 2 <= plan.completion_tokens <= 6
    assert plan_generation(config, "some prompt", max_tokens=100) == plan  # deterministic
    forced = plan_generation(config, "some prompt", max_tokens=100, ignore_eos=True)
    assert (forced.completion_tokens, forced.finish_reason) == (100, "length")


def test_prefill_grows_with_prompt_and_zero_rate_means_no_wait():
    config = cfg(prefill_tokens_per_s=1000, tokens_per_s=0)
    short = plan_generation(config, "x" * 40, 1)
    long = plan_generation(config, "x" * 4000, 1)
    assert long.prefill_s > short.prefill_s > 0
    assert long.token_interval_s == 0
    instant = plan_generation(cfg(prefill_tokens_per_s=0, tokens_per_s=0), "x" * 4000, 1)
    assert instant.prefill_s == 0


def test_context_overflow_is_rejected_naming_the_limit():
    with pytest.raises(PlanRejected) as err:
        plan_generation(cfg(max_model_len=100), "x" * 200, max_tokens=60)
    assert "100" in err.value.message and err.value.param == "max_tokens"
    with pytest.raises(PlanRejected):
        plan_generation(cfg(), "hi", max_tokens=0)
    # Without max_tokens the output shrinks to what the context allows.
    plan = plan_generation(cfg(max_model_len=100, default_max_tokens=90), "x" * 200, None)
    assert (plan.completion_tokens, plan.finish_reason) == (50, "length")


def test_token_schedule_is_absolute_and_skips_tiny_waits():
    assert token_delay(10.0, 3, 0.5, now=10.0) == pytest.approx(1.5)
    assert token_delay(10.0, 3, 0.5, now=12.0) == 0.0  # behind schedule: catch up
    assert token_delay(10.0, 1, MIN_SLEEP_S / 10, now=10.0) == 0.0
    assert token_delay(10.0, 5, 0.0, now=0.0) == 0.0


def test_kv_usage_is_clamped_fraction():
    assert kv_usage(0, 100) == 0.0
    assert kv_usage(25, 100) == 0.25
    assert kv_usage(500, 100) == 1.0


def test_config_rejects_impossible_knobs():
    with pytest.raises(ValueError, match="error_rate"):
        cfg(error_rate=1.5)
    with pytest.raises(ValueError, match="max_num_seqs"):
        cfg(max_num_seqs=0)


def test_scheduler_is_fifo_and_bounded():
    async def scenario() -> tuple[list[int], int]:
        sched = SeqScheduler(max_num_seqs=2)
        order: list[int] = []
        peak = 0
        # Nobody finishes before the snapshot below: a bare 10 ms hold could expire during a slow
        # (GC-paused) arrival loop and hand a slot on early.
        arrivals_done = asyncio.Event()

        async def request(i: int) -> None:
            nonlocal peak
            seq = await sched.admit(prompt_tokens=10)
            peak = max(peak, sched.snapshot().running)
            order.append(i)
            await arrivals_done.wait()
            await asyncio.sleep(0.01)
            sched.finish(seq)

        tasks = []
        for i in range(6):
            tasks.append(asyncio.create_task(request(i)))
            await asyncio.sleep(0)  # arrival order = i
        snap = sched.snapshot()
        assert (snap.running, snap.waiting, snap.held_tokens) == (2, 4, 20)
        arrivals_done.set()
        await asyncio.gather(*tasks)
        assert sched.snapshot().running == 0
        return order, peak

    order, peak = asyncio.run(scenario())
    assert order == list(range(6))
    assert peak == 2


def test_cancelled_waiter_leaves_queue_and_slot_passes_on():
    async def scenario() -> list[str]:
        sched = SeqScheduler(max_num_seqs=1)
        holder = await sched.admit(1)
        got: list[str] = []

        async def wait(name: str) -> None:
            seq = await sched.admit(1)
            got.append(name)
            sched.finish(seq)

        a = asyncio.create_task(wait("a"))
        b = asyncio.create_task(wait("b"))
        await asyncio.sleep(0)
        assert sched.snapshot().waiting == 2
        a.cancel()
        await asyncio.sleep(0)
        assert sched.snapshot().waiting == 1
        sched.finish(holder)
        await b
        assert sched.snapshot().running == 0
        return got

    assert asyncio.run(scenario()) == ["b"]


def test_outputs_are_deterministic():
    seed = text_seed("prompt")
    assert generated_text(seed, 5) == generated_text(text_seed("prompt"), 5)
    assert generated_text(seed, 5) != generated_text(text_seed("other prompt"), 5)
    vec = embedding("hello", 64)
    assert len(vec) == 64 and vec == embedding("hello", 64) and vec != embedding("hellp", 64)
    assert sum(v * v for v in vec) == pytest.approx(1.0)
    assert isinstance(encode_base64(vec), str)
    assert relevance_score("gpu vm", "a gpu vm here") > relevance_score("gpu vm", "bananas")
