"""A per-tenant cache_salt on what reaches a replica (issues 37, 50): through a real gateway to a
loopback engine stand-in that records bodies, two tenants' equal prompts carry different salts,
one tenant's calls the same salt, a client's own cache_salt is combined with its tenant's, never
passed through, on every route that reaches an engine (/v1/responses included), and the salt is
keyed: nobody without the gateway's secret computes another tenant's."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx

from gateway.cache_salt import salt_for, salted
from gateway.request_body import BodyInfo
from gateway.routes import parse_route
from tests.gateway.gateway_harness import (
    HMAC_SECRET,
    GatewayProcess,
    make_key,
    publish_endpoint,
    sqlite_state,
)

SECRET = HMAC_SECRET.encode()


def _unkeyed(tenant: str) -> str:
    """The salt before issue 50: anyone could compute a tenant's from its name."""
    return hashlib.blake2b(f"t:{tenant}".encode(), digest_size=16, person=b"fabric-salt").hexdigest()

CHAT = {"model": "sim-m", "max_tokens": 2, "messages": [{"role": "user", "content": "same prompt"}]}


class Recorder:
    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
                raw = json.dumps({"id": "x", "object": "chat.completion", "model": "sim-m", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host, self.port = "127.0.0.1", self.server.server_address[1]


def test_each_tenant_gets_its_own_salt(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "cache-salt")
    rec = Recorder()
    publish_endpoint(store, "chat", [SimpleNamespace(host=rec.host, port=rec.port)])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    try:
        _, a1 = make_key(store, "chat", tenant="acme")
        _, a2 = make_key(store, "chat", tenant="acme")
        _, b = make_key(store, "chat", tenant="globex")
        acme = salt_for(SECRET, "acme", "x")
        for key, extra in ((a1, {}), (a2, {}), (b, {"cache_salt": acme})):
            r = httpx.post(gw.openai_base("chat") + "/chat/completions", json={**CHAT, **extra}, timeout=30,
                           headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
        salts = [body["cache_salt"] for body in rec.bodies]
        assert salts[0] == salts[1] == acme and salts[2] == salt_for(SECRET, "globex", "x", acme)
        assert salts[2] != salts[0]  # globex's own claim of acme's salt was combined with its own
        # The attack of issue 50: globex computes acme's salt from its name and sends it where the
        # gateway did not salt (/v1/responses), to share acme's prefix cache and time its prompts.
        for path, body in (("/responses", {"model": "sim-m", "input": "same prompt"}),
                           ("/embeddings", {"model": "sim-m", "input": "same prompt"})):
            r = httpx.post(gw.openai_base("chat") + path, json={**body, "cache_salt": _unkeyed("acme")},
                           timeout=30, headers={"authorization": f"Bearer {b}"})
            assert r.status_code == 200, r.text
            got = rec.bodies[-1]["cache_salt"]
            assert got == salt_for(SECRET, "globex", "x", _unkeyed("acme")) and got not in (acme, _unkeyed("acme"))
        assert acme != _unkeyed("acme") and salt_for(b"another secret", "acme", "x") != acme  # keyed
    finally:
        gw.stop()
        rec.server.shutdown()
        store.close()


def test_salted_bodies():
    data = {"model": "m", "messages": [], "cache_salt": "theirs"}
    raw = json.dumps(data).encode()
    out = salted(BodyInfo(data=data), raw, _route("/v1/chat/completions"), SECRET, None, "key-1")
    assert json.loads(out.body)["cache_salt"] == salt_for(SECRET, None, "key-1", "theirs") == out.data["cache_salt"]
    assert salt_for(SECRET, None, "key-1") != salt_for(SECRET, "key-1", "z")
    for path in ("/v1/responses", "/v1/messages", "/v1/embeddings", "/v1/score"):
        assert salted(BodyInfo(data=data), raw, _route(path), SECRET, "t", "s").data["cache_salt"] != "theirs"
    for path in ("/v1/batches", "/v1/tokenize"):  # no engine prefix cache behind these
        assert salted(BodyInfo(data=data), raw, _route(path), SECRET, "t", "s").body is None


def _route(path: str):
    return parse_route(path.encode(), b"", "POST")
