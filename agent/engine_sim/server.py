"""run(config): serve the engine with uvicorn on uvloop + httptools, no access log.

The access log and the default asyncio loop each cost more per request than the
simulated engine itself when it runs with tokens_per_s=0 as a benchmark upstream.
"""

from __future__ import annotations

import uvicorn

from agent.engine_sim.app import create_app
from agent.engine_sim.config import EngineConfig


def run(config: EngineConfig) -> None:
    uvicorn.run(
        create_app(config),
        host=config.host,
        port=config.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level=config.log_level,
        # Many keep-alive connections from a concurrency-64 benchmark are normal.
        backlog=2048,
        timeout_keep_alive=30,
    )
