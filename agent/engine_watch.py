"""The agent observes the engines on its own host and reports what changed to fabricd.

Every ``FABRIC_OBSERVE_SECS`` (5 s) the watch scrapes each running replica's /metrics and probes
its /health one hop away with common.engine_metrics.EngineObserver (the same code fabricd runs
where no agent does: the kept-alive HTTP/1.1 client, a semaphore, the runtime's port and path,
the queue hold), and posts to fabricd (POST /api/ai/nodes/{id}/observations) only the observations that
differ materially from the last one fabricd accepted (common.engine_metrics.material: the same
rule fabricd's own writes follow, including the 15 s refresh that keeps a quiet replica inside
the 30 s eligibility window). The body leaves out defaults, carries each reading to the
precision fabricd uses (``REPORT_PRECISION``) and goes gzip-compressed (``Content-Encoding:
gzip``, which fabricd's request guard decompresses under its body limit): a changed replica costs
about 55-85 bytes on the wire in a report of 8-32 (about 270 alone), an unchanged one nothing. A
fabricd that refuses a gzip body (one older than this agent) gets the report again plain at once,
and every later one plain. The heartbeat names the replicas observed here whose
observations fabricd accepted (NodeReport.observed_replicas, ``observed``): the routing
controller and the reconcile probes read those from the store and never connect to these
engines, and still scrape and probe the node's other replicas themselves. If the agent stops,
its heartbeat stops too: those observations age out, so the replicas get weight 0 (as after a
failed scrape) and their health reads as unknown (a failed probe).

What to observe comes from two places: the VM driver (which replicas run, at which address)
and ``TargetBook`` (each replica's deployment and runtime, noted when fabricd asked for the VM:
a file per replica under the agent's state directory, so a restarted agent knows them again).
A replica the book does not know (created before this agent version) is not observed here, so
the heartbeat leaves it out and fabricd goes on scraping and probing it.

A report that fails (fabricd unreachable, a 5xx) is sent again whole on the next tick: nothing
counts as reported until fabricd accepted it. Errors are logged once per distinct message.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from agent.vm.records import RecordDir
from common.agent_api import ObservationReport, ObservedReplica, VmCreateRequest
from common.engine_metrics.material import material_change
from common.engine_metrics.observer import EngineObserver, EngineTarget
from common.engine_metrics.scrape import MetricsScraper
from common.schemas import ReplicaObservation

log = logging.getLogger("fabric-agent.engines")

SCRAPE_TIMEOUT_S = 2.0
CONCURRENCY = 16  # a host runs a few dozen engines at most
# Decimal places a report carries per reading (finer digits are noise to every reader; the
# counters and gauges not named are whole numbers already). Fewer digits compress better.
REPORT_PRECISION = {"scraped_at": 3, "stalled_since": 3, "kv_cache_usage": 4, "ttft_p50_s": 4,
                    "tokens_per_s": 1, "failure_ratio": 4, "ttft_sum_s": 4}


def compact(item: ObservedReplica) -> ObservedReplica:
    """The observation with each reading rounded to ``REPORT_PRECISION``."""
    fields = {name: round(value, places) for name, places in REPORT_PRECISION.items()
              if (value := getattr(item, name)) is not None}
    return item.model_copy(update=fields)


def report_body(items: list[ObservedReplica], sent_at: float, compress: bool = True) -> bytes:
    """A report's body as it goes on the wire: defaults left out, gzip unless ``compress`` is False."""
    body = ObservationReport(sent_at=sent_at, observations=items).model_dump_json(exclude_defaults=True).encode()
    return gzip.compress(body, compresslevel=6, mtime=0) if compress else body


@dataclass
class _Target:
    replica_id: str
    deployment: str
    runtime: str = "vllm"


class TargetBook:
    """Each replica's deployment and runtime, one file per replica under ``directory``."""

    def __init__(self, directory: Path):
        self._records = RecordDir(directory, _Target)

    def note(self, req: VmCreateRequest) -> None:
        self._records.save(_Target(req.replica_id, req.deployment, req.runtime))

    def forget(self, replica_id: str) -> None:
        self._records.remove(replica_id)

    def known(self) -> dict[str, _Target]:
        return {t.replica_id: t for t in self._records.all()}


def targets(vm_driver, book: TargetBook) -> list[EngineTarget]:
    """The running replicas on this host whose engine answers at a known address."""
    known = book.known()
    out = []
    for vm in vm_driver.list():
        t = known.get(vm.id)
        if t is not None and vm.state == "running" and vm.host:
            out.append(EngineTarget(vm.id, vm.host, vm.port, t.runtime, t.deployment))
    return out


class EngineWatch:
    def __init__(self, node_id: str, vm_driver, book: TargetBook, client, *, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.time, scrape_timeout_s: float = SCRAPE_TIMEOUT_S):
        self.node_id = node_id
        self.vm_driver = vm_driver
        self.book = book
        self.client = client  # httpx.Client-like with base_url fabricd (agent.control_plane.FailoverClient)
        self.interval_s = interval_s
        self.clock = clock
        self.observer = EngineObserver(MetricsScraper(timeout_s=scrape_timeout_s, concurrency=CONCURRENCY),
                                       clock=clock, health=True)
        self.reported: dict[str, ReplicaObservation] = {}  # replica -> the last observation fabricd accepted
        # What the heartbeat reports (NodeReport.observed_replicas): the reported replicas still
        # running, replaced whole after each tick (the heartbeat thread reads it).
        self.observed: list[str] = []
        self.last_error = ""
        self.sent_bytes = 0  # report bodies sent (compressed), for the docs' figure and the tests
        self.gzip = True  # False once fabricd refused a gzip body that it took plain

    async def changes(self) -> list[ObservedReplica]:
        """Scrape every target; the observations that differ materially from the reported ones."""
        found = targets(self.vm_driver, self.book)
        observed = await self.observer.observe_all(found)
        live = {t.replica_id for t in found}
        self.observer.keep_only(live, {t.metrics_origin for t in found})
        for rid in [rid for rid in self.reported if rid not in live]:
            del self.reported[rid]
        self.observed = sorted(self.reported)
        return [compact(ObservedReplica(**obs.model_dump(), deployment=t.deployment))
                for t, obs in zip(found, observed) if material_change(self.reported.get(t.replica_id), obs)]

    def send(self, items: list[ObservedReplica]) -> bool:
        """POST the report; True when fabricd accepted it (then these count as reported)."""
        if not items:
            return True
        sent_at = self.clock()
        try:
            resp = self._post(report_body(items, sent_at, self.gzip), self.gzip)
            if self.gzip and resp.status_code in (400, 415, 422):  # perhaps a fabricd that takes no gzip
                plain = self._post(report_body(items, sent_at, False), False)
                if plain.status_code < 400:
                    log.info("fabricd refused a gzip observation report and took it plain: "
                             "sending reports plain from now on")
                    self.gzip = False
                resp = plain
        except httpx.HTTPError as exc:
            return self._failed(f"{type(exc).__name__}: {exc}")
        if resp.status_code >= 400:
            return self._failed(f"HTTP {resp.status_code}: {resp.text[:200]}")
        for item in items:
            self.reported[item.replica_id] = item.record()
        self.observed = sorted(self.reported)
        if self.last_error:
            log.info("observation reports to fabricd work again")
        self.last_error = ""
        return True

    def _post(self, body: bytes, compressed: bool) -> httpx.Response:
        headers = {"content-type": "application/json"}
        if compressed:
            headers["content-encoding"] = "gzip"
        self.sent_bytes += len(body)
        return self.client.post(f"/api/ai/nodes/{self.node_id}/observations", content=body, headers=headers)

    def _failed(self, message: str) -> bool:
        if message != self.last_error:
            log.warning("observation report failed (sent again next tick): %s", message)
        self.last_error = message
        return False

    def run(self, stop: threading.Event) -> None:
        loop = asyncio.new_event_loop()  # the observer's connections live on this thread's loop
        try:
            while not stop.is_set():
                self.send(loop.run_until_complete(self.changes()))
                stop.wait(self.interval_s)
        finally:
            loop.run_until_complete(self.observer.aclose())
            loop.close()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="engine-watch", daemon=True)
        thread.start()
        return thread
