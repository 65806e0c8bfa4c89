"""The agent's engine watch against the engine simulator on loopback: it reports a replica's
observation (with its /health probe) the first time, nothing while the engine is unchanged, the
replica again when its queue or its health moves, and again after a failed report; only replicas
the target book knows and the driver runs are scraped, and the heartbeat names exactly the ones
fabricd accepted (``observed``)."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
from dataclasses import dataclass

import httpx
import pytest

from agent.engine_watch import EngineWatch, TargetBook, compact, targets
from common.agent_api import ObservationReport, ObservedReplica, VmCreateRequest
from common.engine_metrics.material import REFRESH_AFTER_S
from enginesim.process import EngineProcess


@dataclass
class Vm:
    id: str
    state: str
    host: str | None
    port: int


class Driver:
    def __init__(self, vms):
        self.vms = vms

    def list(self):
        return self.vms


class Fabricd:
    """POST /api/ai/nodes/{id}/observations in memory: the reports received, or a 503.
    ``takes_gzip`` False: a fabricd older than gzip reports, which parses the bytes as JSON."""

    def __init__(self, takes_gzip: bool = True):
        self.reports: list[ObservationReport] = []
        self.down = False
        self.takes_gzip = takes_gzip
        self.bodies: list[tuple[str, int]] = []  # (content-encoding, bytes) of each body received

    def post(self, path, content, headers):
        assert path == "/api/ai/nodes/n1/observations"
        encoding = headers.get("content-encoding", "")
        self.bodies.append((encoding, len(content)))
        if self.down:
            return httpx.Response(503, json={"error": {"code": "unavailable", "message": "store down"}})
        if encoding == "gzip" and self.takes_gzip:
            content = gzip.decompress(content)
        try:
            self.reports.append(ObservationReport.model_validate_json(content))
        except ValueError:
            return httpx.Response(422, json={"detail": "JSON decode error"})
        return httpx.Response(200, json={"accepted": len(self.reports[-1].observations), "ignored": []})


@pytest.fixture(scope="module")
def engine():
    with EngineProcess.start(["--model", "sim-m", "--tokens-per-s", "0", "--prefill-tokens-per-s", "0"]) as proc:
        yield proc


def request(rid: str) -> VmCreateRequest:
    return VmCreateRequest(replica_id=rid, deployment="qwen", model_name="m", model_source="hf://org/m")


def test_reports_only_material_changes(engine, tmp_path):
    book = TargetBook(tmp_path / "targets")
    book.note(request("qwen-0"))
    book.note(request("qwen-gone"))  # noted, but its VM is not running: not scraped
    driver = Driver([Vm("qwen-0", "running", engine.host, engine.port), Vm("qwen-gone", "starting", None, 8000),
                     Vm("not-noted", "running", engine.host, engine.port)])
    assert [t.replica_id for t in targets(driver, book)] == ["qwen-0"]
    clock = [1000.0]
    fabricd = Fabricd()
    watch = EngineWatch("n1", driver, book, fabricd, clock=lambda: clock[0])

    loop = asyncio.new_event_loop()  # one loop, as EngineWatch.run keeps one on its thread

    def tick() -> list[str]:
        before = len(fabricd.reports)
        watch.send(loop.run_until_complete(watch.changes()))
        return [o.replica_id for r in fabricd.reports[before:] for o in r.observations]

    def load(**kw):
        httpx.post(f"{engine.url}/sim/load", json=kw).raise_for_status()

    def faults(**kw):
        httpx.post(f"{engine.url}/sim/faults", json=kw).raise_for_status()

    try:
        fabricd.down = True
        assert tick() == [] and watch.observed == []  # nothing accepted yet: fabricd scrapes it still
        fabricd.down = False
        assert tick() == ["qwen-0"]  # first sight
        assert watch.observed == ["qwen-0"]  # "not-noted" runs too, but the book does not know it
        first = fabricd.reports[0].observations[0]
        assert first.ok and first.deployment == "qwen" and first.queue_depth == 0
        assert (first.health, first.health_error) == (200, "")
        clock[0] += 1
        assert tick() == ["qwen-0"]  # the second scrape gives the first rates (tokens/s appears)
        clock[0] += 1
        assert tick() == []  # nothing moved: nothing sent
        load(waiting=5)
        clock[0] += 1
        assert tick() == ["qwen-0"]
        assert fabricd.reports[-1].observations[0].queue_depth == 5
        clock[0] += 1
        assert tick() == []
        faults(fail_health=True)
        clock[0] += 1
        assert tick() == ["qwen-0"]  # the health probe's answer changed: material
        assert fabricd.reports[-1].observations[0].health == 503 and fabricd.reports[-1].observations[0].ok
        faults(fail_health=False)
        clock[0] += 1
        assert tick() == ["qwen-0"] and fabricd.reports[-1].observations[0].health == 200
        fabricd.down = True
        load(waiting=5, running=2)
        clock[0] += 1
        assert tick() == []  # refused: not counted as reported...
        fabricd.down = False
        clock[0] += 1
        assert tick() == ["qwen-0"]  # ...so sent again once fabricd answers
        assert fabricd.reports[-1].observations[0].running == 2
        clock[0] += REFRESH_AFTER_S
        assert tick() == ["qwen-0"]  # unchanged but aging: refreshed inside the eligibility window
        # Every report went compressed, each reading to the precision REPORT_PRECISION names
        assert {enc for enc, _ in fabricd.bodies} == {"gzip"} and watch.gzip
        refreshed = fabricd.reports[-1].observations[0]
        assert refreshed.scraped_at == round(refreshed.scraped_at, 3)
        assert refreshed.tokens_per_s is None or refreshed.tokens_per_s == round(refreshed.tokens_per_s, 1)
        driver.vms = []  # the replica went away: forgotten
        assert tick() == [] and watch.reported == {} and watch.observed == []
    finally:
        faults(fail_health=False)
        load(waiting=0, running=0)
        loop.run_until_complete(watch.observer.aclose())
        loop.close()


def test_a_failed_scrape_is_reported_once_not_as_idle(tmp_path):
    book = TargetBook(tmp_path / "targets")
    book.note(request("qwen-1"))
    driver = Driver([Vm("qwen-1", "running", "127.0.0.1", 9)])  # nothing listens on the discard port
    fabricd = Fabricd()
    clock = [1000.0]
    watch = EngineWatch("n1", driver, book, fabricd, clock=lambda: clock[0], scrape_timeout_s=0.5)

    async def twice():
        watch.send(await watch.changes())
        clock[0] += 1
        watch.send(await watch.changes())
        await watch.observer.aclose()

    asyncio.run(twice())
    sent = [o for r in fabricd.reports for o in r.observations]
    assert len(sent) == 1 and not sent[0].ok and "ScrapeError" in sent[0].error
    assert sent[0].health == 0 and sent[0].health_error  # no answer to the probe either: unknown health
    assert json.loads(ObservationReport(sent_at=0, observations=sent).model_dump_json())["observations"][0]["ok"] is False


def busy_replica(rng: random.Random, i: int) -> ObservedReplica:
    """One replica's observation as a busy engine's scrape gives it: every reading its own."""
    q = float(rng.randint(0, 8))
    return ObservedReplica(
        deployment=f"llama3-8b-{i // 8:03d}", replica_id=f"llama3-8b-{i // 8:03d}-r{i % 8}-{rng.getrandbits(32):08x}",
        scraped_at=1765000000 + rng.random() * 5, ok=True, queue_depth=q, queue_reads=[q], running=rng.randint(0, 32),
        kv_cache_usage=rng.random(), ttft_p50_s=rng.random() / 5, tokens_per_s=rng.random() * 900, failure_ratio=0.0,
        finished_total=rng.randint(0, 10**6), failed_total=rng.randint(0, 50), ttft_sum_s=rng.random() * 1e5,
        ttft_count=rng.randint(0, 10**6), health=200)


def test_a_node_report_costs_tens_of_bytes_a_replica():
    """16 busy replicas with readings of their own, as ``changes`` hands them over (rounded to
    REPORT_PRECISION): under 100 bytes a replica on the wire, against over 300 plain."""
    rng = random.Random(7)
    items = [compact(busy_replica(rng, i)) for i in range(16)]
    assert items[0].scraped_at == round(items[0].scraped_at, 3) and items[0].kv_cache_usage == round(
        items[0].kv_cache_usage, 4)
    fabricd = Fabricd()
    watch = EngineWatch("n1", Driver([]), None, fabricd, clock=lambda: 1765000005.0)
    assert watch.send(items)
    (encoding, size), = fabricd.bodies
    assert encoding == "gzip" and size / 16 < 100, size / 16
    assert fabricd.reports[0].observations == items  # nothing lost in the compression
    plain = len(ObservationReport(sent_at=0, observations=items).model_dump_json(exclude_defaults=True))
    assert plain / 16 > 300, plain / 16


def test_a_fabricd_without_gzip_gets_the_report_plain_at_once_and_every_later_one(engine, tmp_path):
    """A fabricd older than gzip reports answers 422 to the compressed bytes: the same report goes
    again plain at once (nothing is lost), and later reports go plain from the start."""
    book = TargetBook(tmp_path / "targets")
    names = [f"qwen-{i}" for i in range(4)]
    for rid in names:
        book.note(request(rid))
    driver = Driver([Vm(rid, "running", engine.host, engine.port) for rid in names])
    loop = asyncio.new_event_loop()
    old = Fabricd(takes_gzip=False)
    watch = EngineWatch("n1", driver, book, old, clock=lambda: 1765000000.0)
    try:
        assert watch.send(loop.run_until_complete(watch.changes()))  # refused compressed, taken plain
        assert [enc for enc, _ in old.bodies] == ["gzip", ""] and not watch.gzip
        assert len(old.reports) == 1 and [o.replica_id for o in old.reports[0].observations] == names
        httpx.post(f"{engine.url}/sim/load", json={"waiting": 3}).raise_for_status()
        assert watch.send(loop.run_until_complete(watch.changes()))
        assert [enc for enc, _ in old.bodies] == ["gzip", "", ""]  # plain from then on
        assert old.reports[-1].observations[0].queue_depth == 3
    finally:
        httpx.post(f"{engine.url}/sim/load", json={"waiting": 0}).raise_for_status()
        loop.run_until_complete(watch.observer.aclose())
        loop.close()
