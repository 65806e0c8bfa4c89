"""The engine an app serves: scheduler, metrics, faults and synthetic load together.

`Engine.run_sequence` applies a GenerationPlan: optional added latency, FIFO
admission, prefill, then tokens on the configured schedule, recording vLLM metrics
as it goes. It always releases its slot, also when the client goes away mid-stream.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import AsyncIterator

from enginesim.api_models import FaultsUpdate, LoadUpdate
from enginesim.generation_plan import MIN_SLEEP_S, GenerationPlan, kv_usage, token_delay
from enginesim.lora_routes import LoraState
from enginesim.metrics import EngineMetrics, LiveLoad
from enginesim.prefix_cache import PrefixCache
from enginesim.scheduler import SeqScheduler
from enginesim.settings import EngineSettings, Faults, SyntheticLoad
from enginesim.synthetic_output import token_text


def _publisher(text: str | None):
    """A ZmqEventPublisher for vLLM's --kv-events-config, or None when events are off."""
    if not text:
        return None
    from common.kv_events import ZmqEventPublisher, parse_kv_events_config

    cfg = parse_kv_events_config(text)
    if not cfg.get("enable_kv_cache_events") or cfg.get("publisher", "zmq") != "zmq":
        return None
    return ZmqEventPublisher(cfg.get("endpoint", "tcp://*:5557"), cfg.get("replay_endpoint"), cfg.get("topic", ""),
                             buffer_steps=int(cfg.get("buffer_steps", 10_000)), hwm=int(cfg.get("hwm", 100_000)))


class Engine:
    def __init__(self, settings: EngineSettings):
        self.settings = settings
        self.faults: Faults = settings.initial_faults()
        self.load = SyntheticLoad()
        self.scheduler = SeqScheduler(max_num_seqs=settings.max_num_seqs)
        self.metrics = EngineMetrics(settings.model, self.live_load, settings.legacy_metric_names)
        self._rng = random.Random(settings.seed)
        self.kv_events = _publisher(settings.kv_events_config)
        self.prefix_cache = PrefixCache(settings.prefix_cache_blocks, chars_per_token=settings.chars_per_token,
                                        publish=self.kv_events.publish if self.kv_events else None)
        self.started_at = time.time()
        self.lora = LoraState(settings.max_loras, root=settings.lora_root)
        self.stopping = False  # SIGTERM with --shutdown-timeout 0: stop() was called
        self.draining = False  # SIGTERM with --shutdown-timeout N: no new requests, the running ones finish

    def stop(self) -> None:
        """What vLLM 0.32 does on SIGTERM.

        --shutdown-timeout 0 (its default, abort): the listener closes at once and the engine
        stops, so every request in flight, running or waiting, gets no more tokens and no end;
        its connection stays open until the client goes, and the server exits when the last one
        has.
        --shutdown-timeout N (Fabric's guests: 30): the engine drains. The listener stays open and
        /health answers 200; a new request is answered 500 "cannot schedule new futures after
        shutdown"; the running requests run to their end, the waiting ones are never scheduled;
        once nothing runs (or N s have passed) the server exits and the waiting ones' connections
        close with no end (server.py). tests/enginesim/test_conformance_real.py holds both to
        the real engine."""
        if self.settings.shutdown_timeout_s <= 0:
            self.stopping = True
        else:
            self.draining = True

    def drained(self) -> bool:
        """Draining and nothing runs any more: the server may exit."""
        return self.draining and self.scheduler.snapshot().running == 0

    async def _stall_if_stopping(self) -> None:
        if self.stopping:
            await asyncio.Event().wait()  # never set: ends when the client's disconnect cancels it

    def serves(self, model: str) -> bool:
        """The base model, or a LoRA adapter loaded now."""
        return model == self.settings.model or model in self.lora.loaded

    def live_load(self) -> LiveLoad:
        snap = self.scheduler.snapshot()
        return LiveLoad(
            running=snap.running + self.load.running,
            waiting=snap.waiting + self.load.waiting,
            kv_usage=kv_usage(snap.held_tokens + self.load.kv_tokens, self.settings.kv_capacity_tokens),
        )

    def with_prefix_cache(self, plan: GenerationPlan, prompt_text: str) -> GenerationPlan:
        """The plan with only the prompt's uncached tokens prefilled (and the cache counted)."""
        if self.settings.prefix_cache_blocks <= 0:
            return plan
        hit = self.prefix_cache.lookup_and_insert(prompt_text, plan.prompt_tokens)
        self.metrics.observe_prefix_cache(plan.prompt_tokens, hit)
        if not hit or not plan.prompt_tokens:
            return plan
        return dataclasses.replace(plan, prefill_s=plan.prefill_s * (plan.prompt_tokens - hit) / plan.prompt_tokens)

    def should_fail(self) -> bool:
        rate = self.faults.error_rate
        return rate >= 1.0 or (rate > 0.0 and self._rng.random() < rate)

    def update_faults(self, update: FaultsUpdate) -> Faults:
        self.faults = dataclasses.replace(self.faults, **update.model_dump(exclude_none=True))
        return self.faults

    def update_load(self, update: LoadUpdate) -> SyntheticLoad:
        changes = update.model_dump(exclude_none=True)
        if "queue" in changes:
            changes["waiting"] = changes.pop("queue")
        self.load = dataclasses.replace(self.load, **changes)
        return self.load

    async def run_sequence(self, plan: GenerationPlan, arrived_at: float) -> AsyncIterator[str]:
        """Yield the generated token texts on the engine's schedule.

        `arrived_at` is time.monotonic() when the request arrived, so TTFT includes
        the added latency and the queue wait. Use under contextlib.aclosing so an
        abandoned stream frees its slot at once.
        """
        added = self.faults.added_latency_ms
        if added:
            await asyncio.sleep(added / 1000)
        await self._stall_if_stopping()
        seq = await self.scheduler.admit(plan.prompt_tokens)
        if self.draining:  # granted during a drain: a draining engine schedules no waiting request
            self.scheduler.finish(seq)
            await asyncio.Event().wait()  # ends when the server exits or the client goes
        emitted = 0
        try:
            if plan.prefill_s >= MIN_SLEEP_S:
                await asyncio.sleep(plan.prefill_s)
            first_at = time.monotonic()
            self.metrics.observe_first_token(first_at - arrived_at, plan.prompt_tokens)
            for index in range(plan.completion_tokens):
                if index:
                    delay = token_delay(first_at, index, plan.token_interval_s, time.monotonic())
                    if delay:
                        await asyncio.sleep(delay)
                await self._stall_if_stopping()
                seq.held_tokens += 1
                emitted += 1
                yield token_text(plan.seed, plan.start + index)
            self.metrics.observe_finished(time.monotonic() - arrived_at, plan.finish_reason)
        finally:
            self.metrics.observe_tokens(emitted)
            self.scheduler.finish(seq)
