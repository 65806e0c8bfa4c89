"""The agent's engine watch against the engine simulator on loopback: it reports a replica's
observation (with its /health probe) the first time, nothing while the engine is unchanged, the
replica again when its queue or its health moves, and again after a failed report; only replicas
the target book knows and the driver runs are scraped, and the heartbeat names exactly the ones
fabricd accepted (``observed``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import httpx
import pytest

from agent.engine_watch import EngineWatch, TargetBook, targets
from common.agent_api import ObservationReport, VmCreateRequest
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
    """POST /api/ai/nodes/{id}/observations in memory: the reports received, or a 503."""

    def __init__(self):
        self.reports: list[ObservationReport] = []
        self.down = False

    def post(self, path, content, headers):
        assert path == "/api/ai/nodes/n1/observations"
        if self.down:
            return httpx.Response(503, json={"error": {"code": "unavailable", "message": "store down"}})
        self.reports.append(ObservationReport.model_validate_json(content))
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
        # An idle replica's report is small: defaults are left out.
        body = ObservationReport(sent_at=clock[0], observations=fabricd.reports[-1].observations)
        per_replica = len(body.model_dump_json(exclude_defaults=True)) - len('{"sent_at":0.0,"observations":[]}')
        assert per_replica < 600, per_replica
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
