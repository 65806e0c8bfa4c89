"""run(config): serve the engine with uvicorn on uvloop + httptools, no access log.

The access log and the default asyncio loop each cost more per request than the
simulated engine itself when it runs with tokens_per_s=0 as a benchmark upstream.
"""

from __future__ import annotations

import asyncio

import uvicorn
import uvloop

from agent.engine_sim.app import create_app, create_metrics_app
from agent.engine_sim.config import EngineConfig


class _Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM/SIGINT also stops the engine the way vLLM's does: the
    listener closes at once and requests in flight get nothing more (Engine.stop)."""

    def __init__(self, config: uvicorn.Config, engine):
        super().__init__(config)
        self._engine = engine

    def handle_exit(self, sig, frame) -> None:
        self._engine.stop()
        super().handle_exit(sig, frame)


def run(config: EngineConfig) -> None:
    app = create_app(config)
    engine = app.state.engine
    if config.serving_metrics_port == config.port:
        _Server(uvicorn.Config(app, **_options(config, config.port)), engine).run()
        return
    # The runtime serves /metrics on a port of its own: two servers on one loop, one engine.
    metrics = create_metrics_app(engine)
    servers = [_Server(uvicorn.Config(app, **_options(config, config.port)), engine),
               _Server(uvicorn.Config(metrics, **_options(config, config.serving_metrics_port)), engine)]

    async def serve_both() -> None:
        # A signal reaches one server's handler: when either stops, stop the other too.
        tasks = [asyncio.create_task(s.serve()) for s in servers]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)

    uvloop.run(serve_both())


def _options(config: EngineConfig, port: int) -> dict:
    return {
        "host": config.host,
        "port": port,
        "loop": "uvloop",
        "http": "httptools",
        "access_log": False,
        "log_level": config.log_level,
        # Many keep-alive connections from a concurrency-64 benchmark are normal.
        "backlog": 2048,
        "timeout_keep_alive": 30,
    }
