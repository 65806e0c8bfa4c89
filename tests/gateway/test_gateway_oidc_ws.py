"""OIDC JWTs against a JWKS served on loopback, the WebSocket bridge against a real echo server,
and dry-run mode -- each through a real gateway process."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import jwt
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from common import audit_chain, keyspace
from common.schemas import EndpointStatus, InferenceEndpoint, Replica
from enginesim.process import free_port
from lab.rigs.polling import wait_for
from lab.rigs.routing_plans import publish_plans
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state

ISSUER = "https://idp.example.test"


class Idp:
    """An RSA key and a JWKS document served over HTTP on loopback."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        doc = json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(doc)))
                self.end_headers()
                self.wfile.write(doc)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.jwks_url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"

    def token(self, aud: str = "fabric-inference", iss: str = ISSUER, **claims) -> str:
        body = {"iss": iss, "aud": aud, "sub": "alice", "exp": int(time.time()) + 600, "fabric_endpoints": "*",
                **claims}
        return jwt.encode(body, self.key, algorithm="RS256", headers={"kid": "k1"})

    def stop(self) -> None:
        self.server.shutdown()


class EchoServer:
    """A WebSocket echo upstream on its own event loop thread."""

    def __init__(self) -> None:
        self.port = free_port()
        self.seen_paths: list[str] = []
        ready = threading.Event()
        self.loop = asyncio.new_event_loop()

        async def echo(ws):
            self.seen_paths.append(ws.request.path)
            async for msg in ws:
                await ws.send(msg)

        async def main():
            async with ws_serve(echo, "127.0.0.1", self.port):
                ready.set()
                self.stop_future = self.loop.create_future()
                await self.stop_future

        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),), daemon=True)
        self.thread.start()
        ready.wait(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_future.set_result, None)
        self.thread.join(5)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "oidc")
    idp, echo = Idp(), EchoServer()
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    ep = InferenceEndpoint(name="ws", deployment="ws-dep", status=EndpointStatus(phase="Ready"))
    store.put(keyspace.endpoints("ws"), ep.model_dump_json())
    store.put(keyspace.replicas("ws-dep", "ws-0"), Replica(replica_id="ws-0", deployment="ws-dep", ordinal=0,
              node="n", host="127.0.0.1", port=echo.port, ready=True, phase="Ready").model_dump_json())
    dead = InferenceEndpoint(name="wsdead", deployment="wsdead-dep", status=EndpointStatus(phase="Ready"))
    store.put(keyspace.endpoints("wsdead"), dead.model_dump_json())
    store.put(keyspace.replicas("wsdead-dep", "d-0"), Replica(replica_id="d-0", deployment="wsdead-dep", ordinal=0,
              node="n", host="127.0.0.1", port=free_port(), ready=True, phase="Ready").model_dump_json())
    # a VIP nothing answers (no dataplane here) in front of a ready echo replica
    vip = InferenceEndpoint(name="wsvip", deployment="ws-dep", status=EndpointStatus(phase="Ready", vip="127.0.100.9"))
    store.put(keyspace.endpoints("wsvip"), vip.model_dump_json())
    publish_plans(store)  # the routing controller's plan: what the gateway routes on
    oidc_env = {"FABRIC_OIDC_ISSUER": ISSUER, "FABRIC_OIDC_JWKS_URL": idp.jwks_url, "FABRIC_OIDC_CLAIMS": "tenant endpoints",
                "FABRIC_USER_STREAMS": "1"}
    strict = GatewayProcess.start(state, url, oidc_env)
    store.put(keyspace.endpoints("nogpu"), InferenceEndpoint(name="nogpu", deployment="nogpu-dep",
                                                             status=EndpointStatus(phase="Pending")).model_dump_json())
    lax = GatewayProcess.start(state, url, {**oidc_env, "FABRIC_GATEWAY_ACCEPT_JWT": "1", "FABRIC_DRY_RUN": "1",
                                            "FABRIC_MAX_GENERATED_TOKENS": "50"})
    yield {"store": store, "idp": idp, "echo": echo, "strict": strict, "lax": lax}
    for p in (strict, lax):
        p.stop()
    engine.stop()
    echo.stop()
    idp.stop()
    store.close()


def chat(gw, token: str) -> int:
    r = httpx.post(gw.openai_base("chat") + "/chat/completions", headers={"authorization": f"Bearer {token}"},
                   json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    return r.status_code


def test_oidc_audience_issuer_and_tenant(env):
    idp, strict = env["idp"], env["strict"]
    c = openai.OpenAI(base_url=strict.openai_base("chat"), api_key=idp.token(tenant="acme"), max_retries=0)
    assert c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat(strict, idp.token(aud="fabric-admin")) == 401
    assert chat(strict, idp.token(iss="https://evil.test")) == 401
    assert chat(strict, idp.token(exp=int(time.time()) - 10)) == 401
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode({"iss": ISSUER, "aud": "fabric-inference", "sub": "x", "exp": int(time.time()) + 60},
                        other, algorithm="RS256", headers={"kid": "k1"})
    assert chat(strict, forged) == 401
    assert chat(env["lax"], idp.token(aud="fabric-admin")) == 200  # FABRIC_GATEWAY_ACCEPT_JWT=1
    # OIDC callers reach only the endpoints their token's claim names.
    assert chat(strict, idp.token(fabric_endpoints=["chat", "other"])) == 200
    assert chat(strict, idp.token(fabric_endpoints="other more")) == 403
    assert chat(strict, idp.token(fabric_endpoints=None)) == 403
    wait_for(lambda: "acme" in {r.get("tenant") for r in audit_chain.read_rows(env["store"])}, 5,
             "an audit row of tenant acme", interval=0.05)


def test_dry_run_answers_after_auth_with_two_sse_chunks_when_streaming(env):
    # An endpoint with no replica yet (no GPU): dry run answers without an upstream.
    _, key = make_key(env["store"], "nogpu")
    c = openai.OpenAI(base_url=env["lax"].openai_base("nogpu"), api_key=key, max_retries=0)
    out = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert "dry run" in out.choices[0].message.content
    chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert len(chunks) == 2
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=env["lax"].openai_base("nogpu"), api_key="fvai_000000000000_x",
                      max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    _, nowhere = make_key(env["store"], "nowhere")
    with pytest.raises(openai.NotFoundError):  # an endpoint that does not exist is not a dry-run success
        openai.OpenAI(base_url=env["lax"].openai_base("nowhere"), api_key=nowhere,
                      max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_dry_run_applies_every_cap_and_limit(env):
    _, key = make_key(env["store"], "nogpu", request_quota=3)
    c = openai.OpenAI(base_url=env["lax"].openai_base("nogpu"), api_key=key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as big:  # FABRIC_MAX_GENERATED_TOKENS=50 on the dry-run gateway
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=500)
    assert big.value.status_code == 400
    for _ in range(3):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    with pytest.raises(openai.RateLimitError):  # the key's quota of 3 is spent, dry run or not
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5)


def ws_url(gw, endpoint: str) -> str:
    return gw.url.replace("http://", "ws://") + f"/api/ai/openai/{endpoint}/v1/realtime?model=sim-m"


def test_websocket_echo_through_the_bridge_holds_a_stream_slot(env):
    _, key = make_key(env["store"], "ws")
    hdr = {"Authorization": f"Bearer {key}", "x-user-id": "wsuser"}
    with ws_connect(ws_url(env["strict"], "ws"), additional_headers=hdr) as ws:
        ws.send("hello")
        assert ws.recv(timeout=5) == "hello"
        ws.send(b"\x00\x01")
        assert ws.recv(timeout=5) == b"\x00\x01"
        with pytest.raises(InvalidStatus) as held:  # FABRIC_USER_STREAMS=1 while this socket is open
            ws_connect(ws_url(env["strict"], "ws"), additional_headers=hdr, open_timeout=5)
        assert held.value.response.status_code == 429
    assert env["echo"].seen_paths[-1] == "/v1/realtime?model=sim-m"
    def reopened() -> bool:
        try:
            with ws_connect(ws_url(env["strict"], "ws"), additional_headers=hdr, open_timeout=5) as ws:
                ws.send("again")
                return ws.recv(timeout=5) == "again"
        except InvalidStatus:
            return False

    wait_for(reopened, 5, "a new session once the first one ended", interval=0.05)


def test_websocket_falls_back_from_a_dead_vip_to_a_ready_replica(env):
    _, key = make_key(env["store"], "wsvip")
    with ws_connect(ws_url(env["strict"], "wsvip"), additional_headers={"Authorization": f"Bearer {key}"},
                    open_timeout=15) as ws:
        ws.send("via the replica")
        assert ws.recv(timeout=5) == "via the replica"


def test_websocket_refusals(env):
    with pytest.raises(InvalidStatus) as no_key:
        ws_connect(ws_url(env["strict"], "ws"), open_timeout=5)
    assert no_key.value.response.status_code == 401
    _, key = make_key(env["store"], "wsdead")
    with pytest.raises(InvalidStatus) as dead:
        ws_connect(ws_url(env["strict"], "wsdead"), additional_headers={"Authorization": f"Bearer {key}"},
                   open_timeout=15)
    assert dead.value.response.status_code == 502


def test_websocket_query_cannot_smuggle_a_second_model(env):
    _, key = make_key(env["store"], "ws", model="sim-m")
    hdr = {"Authorization": f"Bearer {key}"}
    base = env["strict"].url.replace("http://", "ws://") + "/api/ai/openai/ws/v1/realtime"
    seen = len(env["echo"].seen_paths)
    # An encoded '?' in the path would have reached the upstream as a first, unchecked model.
    for url in (base + "%3Fmodel%3Dother?model=sim-m", base + "?model=sim-m&model=other"):
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(url, additional_headers=hdr, open_timeout=5)
        assert refused.value.response.status_code == 400
    with pytest.raises(InvalidStatus) as other:
        ws_connect(base + "?model=other", additional_headers=hdr, open_timeout=5)
    assert other.value.response.status_code == 403
    assert len(env["echo"].seen_paths) == seen  # none of them reached the upstream
    with ws_connect(base + "?model=sim-m&x=%20y", additional_headers=hdr, open_timeout=5) as ws:
        ws.send("ok")
        assert ws.recv(timeout=5) == "ok"
    assert env["echo"].seen_paths[-1] == "/v1/realtime?model=sim-m&x=%20y"  # the raw query, as sent
