"""run(settings): serve the engine with uvicorn on uvloop + httptools, no access log.

The access log and the default asyncio loop each cost more per request than the
simulated engine itself when it runs with tokens_per_s=0 as a benchmark upstream.
"""

from __future__ import annotations

import asyncio

import uvicorn
import uvloop

from enginesim.app import create_app, create_metrics_app
from enginesim.settings import EngineSettings


class _Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM/SIGINT also stops the engine the way vLLM's does
    (Engine.stop): with --shutdown-timeout 0 the listener closes at once and requests in flight
    get nothing more; with N the listener stays open while the running requests finish (at most
    N s), then the server exits without waiting for the waiting requests' clients."""

    def __init__(self, config: uvicorn.Config, engine):
        super().__init__(config)
        self._engine = engine
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig, frame) -> None:
        self._engine.stop()
        if not self._engine.draining or self._drain is not None:  # abort, or a second signal: out now
            super().handle_exit(sig, frame)
            return
        self._drain = asyncio.get_running_loop().create_task(self._exit_when_drained(sig, frame))

    async def _exit_when_drained(self, sig, frame) -> None:
        deadline = asyncio.get_running_loop().time() + self._engine.settings.shutdown_timeout_s
        while not self._engine.drained() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        super().handle_exit(sig, frame)
        self.force_exit = True  # the waiting requests never end: their connections close with the process


def run(settings: EngineSettings) -> None:
    app = create_app(settings)
    engine = app.state.engine
    if settings.serving_metrics_port == settings.port:
        _Server(uvicorn.Config(app, **_options(settings, settings.port)), engine).run()
        return
    # The runtime serves /metrics on a port of its own: two servers on one loop, one engine.
    metrics = create_metrics_app(engine)
    servers = [_Server(uvicorn.Config(app, **_options(settings, settings.port)), engine),
               _Server(uvicorn.Config(metrics, **_options(settings, settings.serving_metrics_port)), engine)]

    async def serve_both() -> None:
        # A signal reaches one server's handler: when either stops, stop the other too.
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)

    uvloop.run(serve_both())


def _options(settings: EngineSettings, port: int) -> dict:
    return {
        "host": settings.host,
        "port": port,
        "loop": "uvloop",
        "http": "httptools",
        "access_log": False,
        "log_level": settings.log_level,
        # Many keep-alive connections from a concurrency-64 benchmark are normal.
        "backlog": 2048,
        "timeout_keep_alive": 30,
    }
