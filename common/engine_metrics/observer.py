"""EngineObserver: scrape an engine's /metrics and turn it into its ReplicaObservation.

It keeps, per replica and in memory only (a restart loses one scrape window): the previous
sample and when it was taken (rates come from two samples), the page's kept lines and their
parse (a page whose kept lines did not change is not parsed again), and the queue readings the
hold keeps (common.engine_metrics.hold). A failed scrape or an unreadable page is an ok=False
observation, never zeros. The port and path come from the replica's runtime (names.scrape_target).

The agent runs one for the engines on its host (agent.engine_watch), which also probes each
engine's /health with its scrape (``health``: the observation's health and health_error, so
fabricd's reconcile probes read them); fabricd's routing controller runs one, without health,
for engines whose node's agent does not observe them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from common.engine_metrics.hold import hold, kept
from common.engine_metrics.names import names_for, scrape_target
from common.engine_metrics.parse import (
    EngineSample,
    MetricsParseError,
    SeriesCache,
    failed_observation,
    metric_lines,
    observe,
    parse_lines,
)
from common.engine_metrics.scrape import MetricsScraper, ScrapeError
from common.runtimes import health_path
from common.schemas import ReplicaObservation


@dataclass(frozen=True)
class EngineTarget:
    """One engine to observe: its replica and where its API listens."""

    replica_id: str
    host: str
    port: int
    runtime: str = "vllm"
    deployment: str = ""

    @property
    def metrics_origin(self) -> tuple[str, int]:
        return self.host, scrape_target(self.runtime, self.port)[0]


class EngineObserver:
    def __init__(self, scraper: MetricsScraper, *, clock: Callable[[], float] = time.time, health: bool = False):
        self.scraper = scraper
        self.clock = clock
        self.health = health  # also GET the runtime's /health with each scrape (the agent: fabricd then never probes)
        self.series = SeriesCache()  # each engine's series go through prometheus_client's parser once
        self.samples: dict[str, tuple[EngineSample, float]] = {}
        self.pages: dict[str, tuple[str, EngineSample]] = {}  # replica -> (kept lines, parse)
        self.queue_reads: dict[str, list[tuple[float, float]]] = {}  # replica -> held (t, waiting)

    def _sample(self, replica_id: str, text: str, runtime: str) -> EngineSample:
        names = names_for(runtime)
        lines = metric_lines(text, names)
        cached = self.pages.get(replica_id)
        if cached is not None and cached[0] == lines:
            return cached[1]  # the same lines as last time: the same sample
        sample = parse_lines(lines, names, self.series)
        self.pages[replica_id] = (lines, sample)
        return sample

    async def observe(self, t: EngineTarget) -> ReplicaObservation:
        """One scrape of ``t``'s engine -> its observation (ok=False when it failed), with its
        health probe's answer where this observer probes."""
        obs = await self._metrics(t)
        if not self.health:
            return obs
        try:
            status, error = await self.scraper.probe(t.host, t.port, health_path(t.runtime)), ""
        except ScrapeError as exc:
            status, error = 0, str(exc)[:200]
        return obs.model_copy(update={"health": status, "health_error": error})

    async def _metrics(self, t: EngineTarget) -> ReplicaObservation:
        try:
            port, path = scrape_target(t.runtime, t.port)
            text = await self.scraper.get_text(t.host, port, path)
            now = self.clock()
            sample = self._sample(t.replica_id, text, t.runtime)
        except (ScrapeError, MetricsParseError) as exc:
            return failed_observation(t.replica_id, f"{type(exc).__name__}: {exc}"[:200], self.clock())
        prev = self.samples.get(t.replica_id)
        obs = observe(t.replica_id, sample, prev[0] if prev else None, now - prev[1] if prev else 0.0, now)
        self.samples[t.replica_id] = (sample, now)
        earlier = self.queue_reads.get(t.replica_id, [])
        self.queue_reads[t.replica_id] = kept(earlier, now) + [(now, sample.waiting)]
        return hold(obs, earlier)

    async def observe_all(self, targets: Iterable[EngineTarget]) -> list[ReplicaObservation]:
        """Every target concurrently (the scraper's semaphore bounds the connections in flight)."""
        return list(await asyncio.gather(*(self.observe(t) for t in targets)))

    def keep_only(self, live: set[str], origins: set[tuple[str, int]]) -> None:
        """Forget replicas that are gone and close idle connections to engines no longer observed."""
        for memo in (self.samples, self.pages, self.queue_reads):
            for rid in [rid for rid in memo if rid not in live]:
                del memo[rid]
        self.scraper.keep_only(origins)

    async def aclose(self) -> None:
        await self.scraper.aclose()
