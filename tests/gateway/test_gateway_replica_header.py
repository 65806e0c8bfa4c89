"""x-fabric-replica on the gateway's answers: through a real gateway to two loopback engine
stand-ins that set no such header, each answer names the replica whose address answered (the
console's playground shows it); an upstream that names itself keeps its own header, once.
Through a VIP (a stand-in listening on 127.0.0.2, where the node's Maglev would be) the gateway
cannot know the replica: only an engine that names itself does, and the gateway adds nothing."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import httpx

from common import keyspace
from common.schemas import EndpointStatus, InferenceEndpoint
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sqlite_state

CHAT = {"model": "sim-m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


class Upstream:
    """Answers every chat; counts its calls; sends x-fabric-replica only when ``own`` is set."""

    def __init__(self, own: str | None = None, host: str = "127.0.0.1"):
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["content-length"]))
                outer.calls += 1
                raw = json.dumps({"id": "x", "object": "chat.completion", "model": "sim-m", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                if own:
                    self.send_header("x-fabric-replica", own)
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.host, self.port = host, self.server.server_address[1]


def test_the_answer_names_the_replica_that_answered(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "replica-header")
    ups = [Upstream(), Upstream()]
    selfnamed = Upstream(own="engine-says-so")
    publish_endpoint(store, "chat", [SimpleNamespace(host=u.host, port=u.port) for u in ups])
    publish_endpoint(store, "own", [SimpleNamespace(host=selfnamed.host, port=selfnamed.port)])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    try:
        _, key = make_key(store, "chat")
        seen = set()
        for i in range(16):  # affinity: the session picks the replica (x-session-id)
            before = [u.calls for u in ups]
            r = httpx.post(gw.openai_base("chat") + "/chat/completions", json=CHAT, timeout=30,
                           headers={"authorization": f"Bearer {key}", "x-session-id": f"s{i}"})
            assert r.status_code == 200, r.text
            answered = next(n for n, u in enumerate(ups) if u.calls > before[n])
            seen.add((r.headers["x-fabric-replica"], answered))
        assert seen == {("chat-dep-0", 0), ("chat-dep-1", 1)}  # each id named the upstream that answered
        _, own_key = make_key(store, "own")
        r = httpx.post(gw.openai_base("own") + "/chat/completions", json=CHAT, timeout=30,
                       headers={"authorization": f"Bearer {own_key}"})
        assert r.status_code == 200, r.text
        assert r.headers.get_list("x-fabric-replica") == ["engine-says-so"]
    finally:
        gw.stop()
        for u in (*ups, selfnamed):
            u.server.shutdown()
        store.close()


def _behind_vip(store, name: str, vip: Upstream, replicas: list[Upstream]) -> None:
    publish_endpoint(store, name, [SimpleNamespace(host=u.host, port=u.port) for u in replicas])
    ep = InferenceEndpoint(name=name, deployment=f"{name}-dep", port=vip.port,
                           status=EndpointStatus(phase="Ready", vip=vip.host))
    store.put(keyspace.endpoints(name), ep.model_dump_json())


def test_through_a_vip_only_the_engine_can_say_who_answered(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "replica-header-vip")
    quiet_vip, named_vip = Upstream(host="127.0.0.2"), Upstream(own="behind-the-vip", host="127.0.0.2")
    replica = Upstream()
    _behind_vip(store, "quiet", quiet_vip, [replica])
    _behind_vip(store, "named", named_vip, [replica])
    gw = GatewayProcess.start(state, url, {"FABRIC_GATEWAY_CACHE_SECS": "0.2"})
    try:
        for name, vip, expected in (("quiet", quiet_vip, []), ("named", named_vip, ["behind-the-vip"])):
            _, key = make_key(store, name)
            r = httpx.post(gw.openai_base(name) + "/chat/completions", json=CHAT, timeout=30,
                           headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            assert vip.calls == 1 and replica.calls == 0  # the VIP answered, not the replica's own address
            assert r.headers.get_list("x-fabric-replica") == expected
            why = httpx.get(f"{gw.url}/api/ai/explain/request/{r.headers['x-fabric-request-id']}", timeout=10,
                            headers={"authorization": f"Bearer {key}"}).json()
            assert why["mode"] == "affinity" and "VIP" in why["reason"]
    finally:
        gw.stop()
        for u in (quiet_vip, named_vip, replica):
            u.server.shutdown()
        store.close()
