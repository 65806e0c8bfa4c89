"""agent/vm/vllm_launcher.py: the replica id becomes vLLM's --middleware, and that middleware
names the replica on every HTTP answer (streamed ones too) through a real Starlette app."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from agent.vm import vllm_launcher
from agent.vm.vllm_launcher import MIDDLEWARE, REPLICA_ENV, ReplicaHeader, vllm_argv


def test_the_replica_id_becomes_the_middleware_of_serve():
    env: dict[str, str] = {}
    argv = vllm_argv(["--fabric-replica-id", "chat-0-ab12", "serve", "/m", "--port", "8000"], env)
    assert argv == ["serve", "/m", "--port", "8000", "--middleware", MIDDLEWARE] and env == {REPLICA_ENV: "chat-0-ab12"}
    assert vllm_argv(["--fabric-replica-id", "x", "--version"], {}) == ["--version"]  # not serve: no middleware
    env = {}
    assert vllm_argv(["serve", "/m"], env) == ["serve", "/m"] and env == {}  # no id: unchanged
    module, name = MIDDLEWARE.rsplit(".", 1)
    assert module == vllm_launcher.__name__.rsplit(".", 1)[1] and getattr(vllm_launcher, name) is ReplicaHeader


def _app():
    async def plain(_):
        return PlainTextResponse("ok")

    async def stream(_):
        async def chunks():
            for i in range(3):
                yield f"data: {i}\n\n"
        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/health", plain), Route("/v1/chat/completions", stream, methods=["POST"])])


def test_every_answer_names_the_replica(monkeypatch):
    monkeypatch.setenv(REPLICA_ENV, "chat-0-ab12")
    app = _app()
    app.add_middleware(ReplicaHeader)  # as vLLM adds a --middleware class
    with TestClient(app) as client:
        assert client.get("/health").headers.get_list("x-fabric-replica") == ["chat-0-ab12"]
        r = client.post("/v1/chat/completions")
        assert r.headers.get_list("x-fabric-replica") == ["chat-0-ab12"] and r.text.count("data:") == 3
    monkeypatch.delenv(REPLICA_ENV)
    bare = _app()
    bare.add_middleware(ReplicaHeader)
    with TestClient(bare) as client:
        assert "x-fabric-replica" not in client.get("/health").headers  # no id: no header
