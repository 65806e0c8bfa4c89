"""Gateway paths through real HTTP: session affinity, the connect-failure retry, upstream TLS and
mTLS, and OTLP spans. Real `fabric-gateway` processes in front of real `fabric-engine-sim`
processes on loopback, driven by the official openai client (httpx where raw bytes matter).

Each engine answers with its own `x-fabric-replica` header, so a test can see which replica
took a call. The endpoints have no VIP, so the gateway itself picks the replica."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest

from common import apikeys, audit_chain, pki
from enginesim.process import EngineProcess, free_port
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import (
    BASE_ENV,
    GatewayProcess,
    make_key,
    publish_endpoint,
    sim_engine,
    sqlite_state,
)

REPLICAS = ("rep-a", "rep-b", "rep-c")
# The first 64 characters carry a marker that must never reach a log line or an audit row.
AFFINITY_PREFIX = "affinity-marker-q7vx2 shared opening of every prompt in this group, "
assert len(AFFINITY_PREFIX) >= 64
PROMPT_MARKER = "otel-prompt-marker-k93jd"


def _engine(replica_id: str) -> EngineProcess:
    return sim_engine("--replica-id", replica_id)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "gwpaths")
    engines = {}
    try:
        for rid in REPLICAS:
            engines[rid] = _engine(rid)
        yield {"state": state, "url": url, "store": store, "engines": engines}
    finally:
        for e in engines.values():
            e.stop()
        store.close()


@pytest.fixture(scope="module")
def gw(cluster):
    # Debug logging: the widest log surface for the "prefix is never logged" check.
    g = GatewayProcess.start(cluster["state"], cluster["url"], {"FABRIC_GATEWAY_CACHE_SECS": "0.2"},
                             args=["--log-level", "debug"])
    yield g
    g.stop()


def _client(gw: GatewayProcess, endpoint: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base(endpoint), api_key=key, max_retries=0, timeout=30)


def _chat(c: openai.OpenAI, prompt: str, session: str | None = None, **kw) -> tuple[str, object]:
    """One non-streaming chat call; returns (the replica that answered, the parsed completion)."""
    raw = c.chat.completions.with_raw_response.create(
        model="sim-m", messages=[{"role": "user", "content": prompt}], max_tokens=kw.pop("max_tokens", 3),
        extra_headers={"x-session-id": session} if session else None, **kw)
    return raw.headers["x-fabric-replica"], raw.parse()


def _rows_for(store, key_id: str, n: int, timeout: float = 10.0) -> list[dict]:
    """Audit rows of one key, once it has at least n SUCCESS/FAILED rows (rows land a little after
    the response: the gateway writes them from a background thread)."""
    def rows() -> list[dict] | None:
        mine = [r for r in audit_chain.read_rows(store) if r.get("key_id") == key_id]
        return mine if sum(r["kind"] != "ATTEMPT" for r in mine) >= n else None

    return wait_for(rows, timeout, f"{n} SUCCESS/FAILED audit rows of {key_id}", interval=0.05)


# --- 1. session affinity --------------------------------------------------------------------


def test_session_affinity_by_header_and_prompt_prefix_and_prefix_never_logged(cluster, gw):
    store = cluster["store"]
    publish_endpoint(store, "aff", [cluster["engines"][r] for r in REPLICAS])
    key_id, key = make_key(store, "aff")
    c = _client(gw, "aff", key)

    # The same x-session-id, different prompts: one replica for all ten.
    by_session = {_chat(c, f"question number {i} about something else", session="sess-alpha")[0]
                  for i in range(10)}
    assert len(by_session) == 1 and by_session <= set(REPLICAS)

    # No header: every turn of one conversation (its first user turn resent, the history growing)
    # goes to one replica (the conversation's key: gateway.router_gate.conversation_key).
    history = [{"role": "user", "content": AFFINITY_PREFIX + "the first turn"}]
    by_conversation = set()
    for i in range(10):
        raw = c.chat.completions.with_raw_response.create(model="sim-m", messages=history, max_tokens=3)
        by_conversation.add(raw.headers["x-fabric-replica"])
        history += [{"role": "assistant", "content": raw.parse().choices[0].message.content or ""},
                    {"role": "user", "content": f"then a different tail {i}"}]
    assert len(by_conversation) == 1 and by_conversation <= set(REPLICAS)

    # Different session ids spread over more than one replica.
    spread = {_chat(c, "same prompt for every session", session=f"sess-{i}")[0] for i in range(20)}
    assert len(spread) > 1
    # And so do different prefixes without a header (without affinity every call would go to the
    # first replica by id, which would also pass the "one replica" checks above).
    assert len({_chat(c, f"{i} a prompt that starts differently each time")[0] for i in range(20)}) > 1

    calls = 60
    rows = _rows_for(store, key_id, calls)
    assert sum(r["kind"] == "SUCCESS" for r in rows) == calls
    # A refused call with the prefix: the gateway logs a line for every call that does not succeed.
    _, refused = make_key(store, "aff", model="another-model")
    with pytest.raises(openai.PermissionDeniedError):
        _chat(_client(gw, "aff", refused), AFFINITY_PREFIX + "refused")
    # the line is written just after the response goes out; the search below covers the gateway's own lines
    log = wait_for(lambda: text if "status=403 outcome=refused" in (text := gw.log_text()) else None, 5,
                   "the refused call's log line", interval=0.05)
    head = AFFINITY_PREFIX[:64]
    text = json.dumps(audit_chain.read_rows(store)) + log
    assert "affinity-marker-q7vx2" not in text
    assert head not in text
    for k in (key, refused):
        assert k not in text and apikeys.parse_key(k) + "_" not in text


# --- 2. connect-failure retry -----------------------------------------------------------------


def test_connect_failure_retries_non_streaming_once_moves_a_stream_and_fails_an_unmovable_one_cleanly(cluster, gw):
    store = cluster["store"]
    doomed = _engine("rep-doomed")
    try:
        engines = [cluster["engines"]["rep-a"], cluster["engines"]["rep-b"], doomed]
        publish_endpoint(store, "retry", engines)
        _, key = make_key(store, "retry")
        c = _client(gw, "retry", key)
        sessions = [f"retry-sess-{i}" for i in range(30)]
        before = {s: _chat(c, "hello", session=s)[0] for s in sessions}
        to_doomed = [s for s, rep in before.items() if rep == "rep-doomed"]
        to_live = [s for s, rep in before.items() if rep != "rep-doomed"]
        assert to_doomed and to_live
    finally:
        doomed.stop()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect((doomed.host, doomed.port))
    # The replica is still ready in the store: the gateway still tries it first for its sessions.

    # Non-streaming: the connect failure moves the call to another ready replica, once.
    for s in to_doomed:
        rep, out = _chat(c, "hello again", session=s)
        assert rep in ("rep-a", "rep-b") and out.choices[0].message.content
    # Sessions whose replica is alive keep it.
    for s in to_live[:5]:
        assert _chat(c, "hello again", session=s)[0] == before[s]

    # Streaming: the call moves whole to another ready replica (stream migration, on by
    # default: nothing was sent to the client yet), and says where it went.
    with httpx.stream("POST", gw.openai_base("retry") + "/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {key}", "x-session-id": to_doomed[0]},
                      json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                            "stream": True}) as r:
        assert r.status_code == 200 and r.headers["x-fabric-replica"] in ("rep-a", "rep-b")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
    # A stream that may not move (several choices): no retry; a clean OpenAI-shaped 502 before
    # any byte of the stream.
    with pytest.raises(openai.APIStatusError) as err:
        stream = c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}], n=2,
                                           max_tokens=3, stream=True, extra_headers={"x-session-id": to_doomed[0]})
        list(stream)
    assert err.value.status_code == 502
    assert err.value.response.json()["error"]["code"] == "upstream_unavailable"
    r = httpx.post(gw.openai_base("retry") + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {key}", "x-session-id": to_doomed[0]},
                   json={"model": "sim-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                         "stream": True, "n": 2})
    assert r.status_code == 502 and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == "upstream_unavailable"
    # A stream whose session replica is alive still works.
    live = list(c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3, stream=True, extra_headers={"x-session-id": to_live[0]}))
    assert any(ch.choices and ch.choices[0].delta.content for ch in live)


# --- 3. upstream TLS and mTLS -----------------------------------------------------------------


class TlsFront:
    """A TLS-terminating TCP relay on loopback in front of a plain engine (fabric-engine-sim has
    no TLS option), on its own event loop thread. Records each accepted peer's certificate CN."""

    def __init__(self, backend_port: int, ctx: ssl.SSLContext):
        self.backend_port = backend_port
        self.peers: list[str | None] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=ctx), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.peers.append(pki.peer_common_name(writer.get_extra_info("peercert")))
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.backend_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, ssl.SSLError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def tls(cluster):
    state: Path = cluster["state"]
    ca, _ = pki.ensure_ca(state)
    srv_crt, srv_key = pki.issue_cert(state, "engine-upstream", server=True, client=False, role=None)
    cli_crt, cli_key = pki.issue_cert(state, "gateway-upstream-client", server=False, client=True, role=None)
    engine = cluster["engines"]["rep-a"]
    plain = TlsFront(engine.port, pki.server_ssl_context(srv_crt, srv_key))
    mutual = TlsFront(engine.port, pki.server_ssl_context(srv_crt, srv_key, ca=ca, require_client_cert=True))
    store = cluster["store"]
    # One replica each, pointing at the TLS front instead of the engine.
    for name, front in (("tls", plain), ("mtls", mutual)):
        publish_endpoint(store, name, [SimpleNamespace(host="127.0.0.1", port=front.port)])
    yield {"ca": ca, "cert": cli_crt, "key": cli_key, "plain": plain, "mutual": mutual}
    plain.close()
    mutual.close()


def _tls_calls(gw: GatewayProcess, store, endpoint: str) -> None:
    _, key = make_key(store, endpoint)
    c = _client(gw, endpoint, key)
    rep, out = _chat(c, "over tls")
    assert rep == "rep-a" and out.usage.completion_tokens == 3
    chunks = list(c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "over tls"}],
                                            max_tokens=3, stream=True))
    assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)


def test_backend_tls_with_a_private_ca(cluster, tls):
    store = cluster["store"]
    g = GatewayProcess.start(cluster["state"], cluster["url"], {"FABRIC_BACKEND_TLS": "1",
                                                                 "FABRIC_BACKEND_CA": str(tls["ca"])})
    try:
        before = len(tls["plain"].peers)
        _tls_calls(g, store, "tls")
        assert len(tls["plain"].peers) > before  # the calls really went through the TLS front
        # Without a client certificate, an upstream that requires one refuses: a 502, not a hang.
        _, key = make_key(store, "mtls")
        r = httpx.post(g.openai_base("mtls") + "/chat/completions", headers={"authorization": f"Bearer {key}"},
                       json={"model": "sim-m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unavailable"
        assert tls["mutual"].peers == []
    finally:
        g.stop()


def test_backend_mtls_presents_the_client_certificate(cluster, tls):
    g = GatewayProcess.start(cluster["state"], cluster["url"], {
        "FABRIC_BACKEND_TLS": "1", "FABRIC_BACKEND_CA": str(tls["ca"]),
        "FABRIC_BACKEND_CLIENT_CERT": str(tls["cert"]), "FABRIC_BACKEND_CLIENT_KEY": str(tls["key"])})
    try:
        _tls_calls(g, cluster["store"], "mtls")
        assert tls["mutual"].peers and set(tls["mutual"].peers) == {"gateway-upstream-client"}
    finally:
        g.stop()


def test_partial_mtls_set_refuses_to_start(cluster, tls):
    exe = Path(sys.executable).with_name("fabric-gateway")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(BASE_ENV, FABRIC_BACKEND_TLS="1", FABRIC_BACKEND_CLIENT_CERT=str(tls["cert"]))
    port = free_port()
    out = subprocess.run([*cmd, "serve", "--state-dir", str(cluster["state"]), "--store", cluster["url"],
                          "--listen", f"127.0.0.1:{port}", "--insecure"],
                         check=False, env=env, capture_output=True, text=True, timeout=60,
                         cwd=str(Path(__file__).resolve().parents[2]))
    assert out.returncode == 2
    assert "FABRIC_BACKEND_CLIENT_KEY" in out.stderr and "FABRIC_BACKEND_CA" in out.stderr
    missing = out.stderr.split("missing", 1)[1]
    assert "FABRIC_BACKEND_CLIENT_KEY" in missing and "FABRIC_BACKEND_CA" in missing
    assert "FABRIC_BACKEND_CLIENT_CERT" not in missing
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))


# --- 4. OTLP spans ----------------------------------------------------------------------------


class Collector:
    """A tiny OTLP/HTTP trace collector: POST /v1/traces, protobuf decoded with opentelemetry-proto."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb

        self.bodies: list[bytes] = []
        self.spans: list = []
        self.paths: list[str] = []
        lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    data = gzip.decompress(data)
                req = pb.ExportTraceServiceRequest()
                req.ParseFromString(data)
                with lock:
                    outer.paths.append(self.path)
                    outer.bodies.append(data)
                    for rs in req.resource_spans:
                        service = {a.key: a.value.string_value for a in rs.resource.attributes}.get("service.name")
                        for ss in rs.scope_spans:
                            outer.spans += [(service, sp) for sp in ss.spans]
                reply = pb.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value if v.HasField("string_value") else v.int_value
    return out


def test_otlp_one_span_per_call_with_endpoint_status_tokens_and_no_prompt_or_key(cluster):
    store = cluster["store"]
    publish_endpoint(store, "otel", [cluster["engines"]["rep-b"]])
    collector = Collector()
    g = GatewayProcess.start(cluster["state"], cluster["url"],
                             {"FABRIC_OTEL_ENDPOINT": f"http://127.0.0.1:{collector.port}"})
    try:
        _, key = make_key(store, "otel")
        c = _client(g, "otel", key)
        expected = []
        for i in range(3):
            _, out = _chat(c, f"{PROMPT_MARKER} question {i}", max_tokens=2 + i)
            expected.append(("otel", 200, out.usage.total_tokens))
        chunks = list(c.chat.completions.create(
            model="sim-m", messages=[{"role": "user", "content": PROMPT_MARKER}], max_tokens=4, stream=True,
            stream_options={"include_usage": True}))
        expected.append(("otel", 200, chunks[-1].usage.total_tokens))
        with pytest.raises(openai.AuthenticationError):
            _client(g, "otel", "fvai_000000000000_" + "x" * 43).chat.completions.create(
                model="sim-m", messages=[{"role": "user", "content": PROMPT_MARKER}])
        expected.append(("unknown", 401, 0))

        # the SDK's batch thread exports every 0.5 s
        wait_for(lambda: len(collector.spans) >= len(expected), 15, f"{len(expected)} spans", interval=0.1)
    finally:
        g.stop()  # shutdown flushes anything still queued; nothing more may arrive after this
    try:
        assert set(collector.paths) == {"/v1/traces"}
        assert len(collector.spans) == len(expected)
        got = sorted((a["fabric.endpoint"], a["http.response.status_code"], a["fabric.tokens"])
                     for a in (_attrs(sp) for _, sp in collector.spans))
        assert got == sorted(expected)
        assert {svc for svc, _ in collector.spans} == {"fabric-gateway"}
        assert {sp.name for _, sp in collector.spans} == {"gateway.call"}
        for _, sp in collector.spans:
            assert set(_attrs(sp)) == {"fabric.endpoint", "http.response.status_code", "fabric.tokens"}
        raw = b"".join(collector.bodies)
        assert PROMPT_MARKER.encode() not in raw
        assert key.encode() not in raw and apikeys.parse_key(key).encode() not in raw
    finally:
        collector.close()


def test_otlp_collector_down_never_fails_a_call(cluster):
    store = cluster["store"]
    publish_endpoint(store, "otel-down", [cluster["engines"]["rep-c"]])
    closed = free_port()  # nothing listens here
    g = GatewayProcess.start(cluster["state"], cluster["url"], {"FABRIC_OTEL_ENDPOINT": f"http://127.0.0.1:{closed}"})
    try:
        _, key = make_key(store, "otel-down")
        c = _client(g, "otel-down", key)
        for i in range(3):
            assert _chat(c, f"call {i}")[1].choices[0].message.content
        chunks = list(c.chat.completions.create(model="sim-m", messages=[{"role": "user", "content": "s"}],
                                                max_tokens=3, stream=True))
        assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)
        # Past at least one failed export of the batch thread (every 0.5 s), calls still succeed.
        time.sleep(1.5)
        for i in range(3):
            assert _chat(c, f"later call {i}")[1].choices[0].message.content
        assert g.proc.poll() is None
    finally:
        g.stop()
