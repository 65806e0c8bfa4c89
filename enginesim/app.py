"""create_app(settings): the engine's ASGI app (Starlette, for low per-request cost).

Every response carries `x-fabric-replica` so balancing tests can tell which replica
answered. All state lives in the Engine made here; two apps in one process share
nothing (each has its own Prometheus registry).
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from enginesim.batch_routes import make_batch_routes
from enginesim.control_routes import make_control_routes, metrics_routes
from enginesim.engine import Engine
from enginesim.generate_routes import make_generate_routes
from enginesim.lora_routes import make_lora_routes
from enginesim.pooling_routes import make_pooling_routes
from enginesim.responses_routes import make_responses_routes
from enginesim.settings import EngineSettings

REPLICA_HEADER = "x-fabric-replica"


class ReplicaHeader:
    """Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer and slow streams)."""

    def __init__(self, app: ASGIApp, replica_id: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica_id.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), self.header]
            await send(message)

        await self.app(scope, receive, send_tagged)


async def realtime_echo(ws: WebSocket) -> None:
    """`/v1/realtime`: a WebSocket that echoes every text or binary message back (the gateway's
    WebSocket bridge and the soak's WebSocket traffic need an upstream that speaks one)."""
    await ws.accept()
    try:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return
            if msg.get("text") is not None:
                await ws.send_text(msg["text"])
            elif msg.get("bytes") is not None:
                await ws.send_bytes(msg["bytes"])
    except WebSocketDisconnect:
        return


def create_metrics_app(engine: Engine) -> Starlette:
    """The app on the runtime's separate metrics port (Triton 8002, TEI 9000)."""
    return Starlette(routes=metrics_routes(engine))


def create_app(settings: EngineSettings) -> Starlette:
    engine = Engine(settings)
    routes = [*make_generate_routes(engine), *make_responses_routes(engine), *make_pooling_routes(engine),
              *make_control_routes(engine),
              *make_batch_routes(engine), *make_lora_routes(engine.lora),
              WebSocketRoute("/v1/realtime", realtime_echo)]
    app = Starlette(routes=routes, middleware=[Middleware(ReplicaHeader, replica_id=settings.replica_id)])
    app.state.engine = engine
    return app
