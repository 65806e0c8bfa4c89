"""GET /v1/models, health, metrics and the simulator's own /sim control routes.

Health and metrics sit where the configured runtime serves them (vLLM: /health and /metrics;
Triton: /v2/health/ready, metrics on their own port; TensorRT-LLM: /prometheus/metrics).

/sim routes change faults and synthetic load at runtime so tests and the lab demo
can degrade or load one replica without restarting it. They answer in Fabric's
error shape ({"error": {"code", "message"}}), not OpenAI's.
"""

from __future__ import annotations

import dataclasses

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from common.runtimes import RUNTIME_TABLE
from enginesim import openai_format as fmt
from enginesim.api_models import FaultsUpdate, LoadUpdate
from enginesim.engine import Engine
from enginesim.http_util import JsonBytes, parse_control


def metrics_endpoint(engine: Engine):
    async def metrics(_: Request) -> Response:
        return Response(engine.metrics.render(engine.settings.runtime), media_type=CONTENT_TYPE_LATEST)

    return metrics


def metrics_routes(engine: Engine) -> list[Route]:
    """/metrics alone, for a runtime that serves it on a port of its own (Triton, TEI)."""
    return [Route(RUNTIME_TABLE[engine.settings.runtime].metrics_path, metrics_endpoint(engine), methods=["GET"])]


def make_control_routes(engine: Engine) -> list[Route]:
    settings = engine.settings

    async def models(_: Request) -> Response:
        card = {
            "id": settings.model,
            "object": "model",
            "created": int(engine.started_at),
            "owned_by": "vllm",
            "root": settings.model,
            "parent": None,
            "max_model_len": settings.max_model_len,
        }
        adapters = [{**card, "id": name, "root": path, "parent": settings.model}
                    for name, path in engine.lora.loaded.items()]
        return JsonBytes(fmt.to_json({"object": "list", "data": [card, *adapters]}))

    async def health(_: Request) -> Response:
        # vLLM answers an empty 200; a failing engine answers 503.
        return Response(status_code=503 if engine.faults.fail_health else 200)

    metrics = metrics_endpoint(engine)
    rt = RUNTIME_TABLE[settings.runtime]

    def state_body() -> dict:
        live = engine.live_load()
        real = engine.scheduler.snapshot()
        return {
            "config": dataclasses.asdict(settings),
            "faults": dataclasses.asdict(engine.faults),
            "synthetic_load": dataclasses.asdict(engine.load),
            "scheduler": dataclasses.asdict(real),
            "reported": dataclasses.asdict(live),
            "lora": {"loaded": list(engine.lora.loaded), "loads": engine.lora.loads, "unloads": engine.lora.unloads},
        }

    async def state(_: Request) -> Response:
        return JsonBytes(fmt.to_json(state_body()))

    async def faults(request: Request) -> Response:
        update = await parse_control(request, FaultsUpdate)
        if isinstance(update, Response):
            return update
        engine.update_faults(update)
        return JsonBytes(fmt.to_json(state_body()))

    async def load(request: Request) -> Response:
        update = await parse_control(request, LoadUpdate)
        if isinstance(update, Response):
            return update
        engine.update_load(update)
        return JsonBytes(fmt.to_json(state_body()))

    routes = [Route(rt.health_path, health, methods=["GET"])]
    if settings.serving_metrics_port == settings.port:
        routes.append(Route(rt.metrics_path, metrics, methods=["GET"]))
    return [
        *routes,
        Route("/v1/models", models, methods=["GET"]),
        Route("/sim/state", state, methods=["GET"]),
        Route("/sim/faults", faults, methods=["POST"]),
        Route("/sim/load", load, methods=["POST"]),
    ]
