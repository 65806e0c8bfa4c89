"""The reconcile loop's /health probes go through the engines' HTTP/1.1 client
(common.engine_metrics.scrape): a 200 is ready, any other status is an answer that is not ready,
no answer in time or a refused connection is no answer; one kept-alive connection per engine. A
replica its node's agent observes (Node.observed_replicas) gets the health the agent reported in
its observation, with no connection from fabricd; a missing or aged report is unknown health,
a failed probe without an answer."""

from __future__ import annotations

import asyncio

from common.engine_metrics.material import MAX_SCRAPE_AGE_S
from common.schemas import Replica, ReplicaObservation
from controlplane.orchestration_state import Snapshot
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker
from tests.controlplane.planner_data import node


class Health:
    def __init__(self, status: int):
        self.status, self.connections, self.requests = status, 0, 0

    async def start(self) -> Health:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def handle(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"GET /health HTTP/1.1\r\n")
                self.requests += 1
                if self.status == 0:
                    await asyncio.sleep(30)  # accepts, never answers
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: 2\r\n\r\nok" % self.status)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def replica(rid: str, port: int) -> Replica:
    return Replica(replica_id=rid, deployment="qwen", ordinal=0, node="n1", host="127.0.0.1", port=port,
                   phase="Ready", ready=True)


def test_health_probes(store):
    async def run():
        ok, busy, hung = await Health(200).start(), await Health(503).start(), await Health(0).start()
        worker = ReconcileWorker(store, None, rp.ReconcileSettings(health_timeout_s=0.3))
        reps = [replica("ok", ok.port), replica("busy", busy.port), replica("hung", hung.port),
                replica("refused", 9)]
        first = await worker.probe_all(Snapshot(), reps)
        second = await worker.probe_all(Snapshot(), reps)
        await worker.aclose()
        for srv in (ok, busy, hung):
            srv.server.close()
        return first, second, ok

    first, second, ok = asyncio.run(run())
    assert first == second
    assert first["ok"] == rp.Probe(True, "HTTP 200", answered=True)
    assert first["busy"] == rp.Probe(False, "HTTP 503", answered=True)
    assert not first["hung"].ok and not first["hung"].answered and "timed out" in first["hung"].message
    assert not first["refused"].ok and not first["refused"].answered
    assert ok.requests == 2 and ok.connections == 1  # the connection is kept between probes


def test_replicas_an_agent_observes_get_its_reported_health_and_no_connection(store):
    now = 5000.0
    engine = {}

    def seen(rid: str, health: int | None, age: float = 1.0, error: str = "") -> ReplicaObservation:
        return ReplicaObservation(replica_id=rid, scraped_at=now - age, ok=True, health=health, health_error=error)

    async def run():
        srv = await Health(200).start()
        engine["srv"] = srv
        worker = ReconcileWorker(store, None, rp.ReconcileSettings(health_timeout_s=0.3), clock=lambda: now)
        named = ["up", "busy", "hung", "old", "unprobed", "none", "other"]
        reps = [replica(rid, srv.port) for rid in [*named[:-1], "before-upgrade"]]
        reps.append(replica("other", srv.port).model_copy(update={"node": "n2"}))
        snap = Snapshot(nodes={"n1": node("n1").model_copy(update={"observed_replicas": named}),
                               "n2": node("n2")},  # n1 names n2's replica: that counts for nothing
                        observations={o.replica_id: o for o in [
                            seen("up", 200), seen("busy", 503), seen("hung", 0, error="timed out after 2s"),
                            seen("old", 200, age=MAX_SCRAPE_AGE_S + 1), seen("unprobed", None)]})
        probes = await worker.probe_all(snap, reps)
        await worker.aclose()
        srv.server.close()
        return probes

    probes = asyncio.run(run())
    assert probes["up"] == rp.Probe(True, "HTTP 200", answered=True)
    assert probes["busy"] == rp.Probe(False, "HTTP 503", answered=True)
    assert probes["hung"] == rp.Probe(False, "timed out after 2s")
    for silent in ("old", "none"):  # an aged or absent report: unknown health
        assert not probes[silent].ok and not probes[silent].answered and "no health report" in probes[silent].message
    # Probed from here: the replica n1's agent does not name, n2's (named by the wrong node), and
    # "unprobed", whose stored observation is fabricd's own scrape (no probe in it: the routing
    # pass wrote it over the agent's report before the heartbeat named the replica). Failing
    # that one for want of a report replaced healthy replicas in the lab.
    assert probes["before-upgrade"] == probes["other"] == probes["unprobed"] == rp.Probe(True, "HTTP 200",
                                                                                        answered=True)
    assert engine["srv"].requests == 3
