"""The reconcile loop's /health probes go through the engines' HTTP/1.1 client
(common.engine_metrics.scrape): a 200 is ready, any other status is an answer that is not ready,
no answer in time or a refused connection is no answer; one kept-alive connection per engine."""

from __future__ import annotations

import asyncio

from common.schemas import Replica
from controlplane.reconcile import plan as rp
from controlplane.reconcile.apply import ReconcileWorker


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
        first = await worker.probe_all(reps)
        second = await worker.probe_all(reps)
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
