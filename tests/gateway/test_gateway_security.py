"""Security findings of issue 40 on the gateway, through a real gateway in front of a real
engine: an attacker-sized ``model`` is refused before anything keeps it, the engine's control
routes are not reachable, a key's priority is a ceiling, and caller-named limit counters are
the caller's tenant's own. The audit writer's bounds are tested on a real store below."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading

import httpx
import pytest

from common import audit_chain, keyspace
from common.store.connect import open_store
from gateway.app import call_band
from gateway.audit import MAX_BATCH_BYTES, MAX_FIELD_CHARS, AuditWriter, capped, row_bytes, split_by_bytes
from gateway.batch_writer import BatchWriter
from gateway.request_body import MAX_MODEL_CHARS
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state

ENV = {"FABRIC_GATEWAY_CACHE_SECS": "0.2", "FABRIC_USER_RPM": "2"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "security")
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    gw = GatewayProcess.start(state, url, ENV)
    keys = {name: make_key(store, "chat", **fields)[1] for name, fields in (
        ("plain", {}), ("low", {"priority": "low"}), ("high", {"priority": "high"}),
        ("a", {"tenant": "team-a"}), ("b", {"tenant": "team-b"}))}
    yield {"store": store, "gw": gw, "keys": keys, "engine": engine}
    gw.stop()
    engine.stop()
    store.close()


def post(env, key: str, body: dict | bytes, path: str = "/chat/completions", headers: dict | None = None):
    h = {"authorization": f"Bearer {env['keys'][key]}", **(headers or {})}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(env["gw"].openai_base("chat") + path, content=content, headers={
        "content-type": "application/json", **h}, timeout=30)


def explain(env, key: str, r: httpx.Response) -> dict:
    rid = r.headers["x-fabric-request-id"]
    return httpx.get(f"{env['gw'].url}/api/ai/explain/request/{rid}",
                     headers={"authorization": f"Bearer {env['keys'][key]}"}, timeout=10).json()


def _openai_error(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["type"] == code and err["message"]


# --- model names ----------------------------------------------------------------------------------

def test_a_1_mb_model_name_is_400_and_nothing_keeps_it(env):
    huge = "m" * 1_000_000  # 1 MB, under the 1 MiB body cap
    r = post(env, "plain", {"model": huge, **CHAT})
    _openai_error(r, 400, "invalid_model")
    assert huge[:1000] not in r.text
    assert explain(env, "plain", r).get("error", {}).get("code") == "not_found"  # no explanation kept
    for bad in ("", "a b", "x\nINJECTED", "../etc", "m" * (MAX_MODEL_CHARS + 1)):
        _openai_error(post(env, "plain", {"model": bad, **CHAT}), 400, "invalid_model")
    _openai_error(post(env, "plain", {"model": 12, **CHAT}), 400, "invalid_model")
    ok = post(env, "plain", {"model": "sim-m", **CHAT})
    assert ok.status_code == 200, ok.text
    rows = audit_chain.read_rows(env["store"])
    assert rows and all(len(str(v)) <= MAX_FIELD_CHARS for row in rows for v in row.values())
    assert not any(row.get("model") not in (None, "sim-m") for row in rows)


# --- the engine's control routes ------------------------------------------------------------------

@pytest.mark.parametrize("method,path", [
    ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/unload_lora_adapter"), ("POST", "/sleep"),
    ("GET", "/metrics"), ("POST", "/reset_prefix_cache"), ("POST", "/wake_up"), ("POST", "/collective_rpc"),
    ("POST", "/v1/unknown/generate"), ("GET", "/is_sleeping"),
])
def test_engine_control_routes_are_404_through_the_gateway(env, method, path):
    r = httpx.request(method, env["gw"].url + "/api/ai/openai/chat" + path,
                      headers={"authorization": f"Bearer {env['keys']['plain']}", "content-type": "application/json"},
                      content=b'{"lora_name": "x", "lora_path": "/tmp/x"}' if method == "POST" else None, timeout=10)
    _openai_error(r, 404, "not_found")
    assert "the gateway does not serve" in r.json()["error"]["message"]  # answered here, not by the engine


def test_control_routes_are_404_on_the_root_v1_too(env):
    r = httpx.post(env["gw"].url + "/v1/unload_lora_adapter", json={"lora_name": "x", "model": "sim-m"},
                   headers={"authorization": f"Bearer {env['keys']['plain']}"}, timeout=10)
    _openai_error(r, 404, "not_found")
    assert "the gateway does not serve" in r.json()["error"]["message"]


# --- priority -------------------------------------------------------------------------------------

def test_a_low_keys_high_header_is_served_as_low(env):
    r = post(env, "low", {"model": "sim-m", **CHAT}, headers={"x-request-priority": "high"})
    assert r.status_code == 200, r.text
    assert explain(env, "low", r)["band"] == "low"
    r = post(env, "high", {"model": "sim-m", **CHAT}, headers={"x-request-priority": "low"})
    assert explain(env, "high", r)["band"] == "low"  # asking for less is always allowed
    r = post(env, "high", {"model": "sim-m", **CHAT})
    assert explain(env, "high", r)["band"] == "high"


def test_call_band_is_capped_by_the_key():
    assert call_band("high", "low") == "low"
    assert call_band("HIGH", None) == "normal"  # no priority on the key: normal at most
    assert call_band(None, "high") == "high" and call_band(None, None) == "normal"
    assert call_band("low", "high") == "low"


# --- caller-named limit counters ------------------------------------------------------------------

def test_x_user_id_counters_are_namespaced_by_tenant(env):
    alice = {"x-user-id": "alice@team-b"}
    for _ in range(2):
        assert post(env, "a", {"model": "sim-m", **CHAT}, headers=alice).status_code == 200
    refused = post(env, "a", {"model": "sim-m", **CHAT}, headers=alice)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    # Team b's own alice was not spent by team a's key naming her.
    assert post(env, "b", {"model": "sim-m", **CHAT}, headers=alice).status_code == 200
    names = [kv.key for kv in env["store"].list(keyspace.counters("rpm/user/"))]
    assert any(k.endswith("/t-team-a/alice@team-b") for k in names)
    assert any(k.endswith("/t-team-b/alice@team-b") for k in names)


# --- the audit writer's bounds --------------------------------------------------------------------

def test_audit_strings_are_capped_and_batches_split_by_bytes(tmp_path):
    store = open_store(f"sqlite://{tmp_path}/a.db")
    writer = AuditWriter(store)
    try:
        # 1,200 rows of about 600 bytes once capped: more than two MAX_BATCH_BYTES, so even when the
        # writer's thread takes them all in one flush they must be written as several entries.
        for i in range(1200):
            writer.record("ATTEMPT", request_id=f"r{i}", key_id="k", tenant="t" * 5000, endpoint="e", model="x" * 10**6)
        writer.flush()
        rows = audit_chain.read_rows(store)
        assert len(rows) == 1200 and all(len(r["model"]) == MAX_FIELD_CHARS for r in rows)
        entries = [kv.value for kv in store.list(keyspace.audit("")) if "rows" in kv.value]
        assert len(entries) > 1 and max(len(v) for v in entries) < 2 * MAX_BATCH_BYTES
        assert audit_chain.verify(store).ok
    finally:
        writer.close()
        store.close()


def test_split_by_bytes_keeps_order_and_bounds_each_run():
    rows = [("ATTEMPT", capped({"request_id": str(i), "model": "m" * 10_000})) for i in range(300)]
    runs = split_by_bytes(rows, limit=20_000)
    assert [r for run in runs for r in run] == rows
    assert all(sum(row_bytes(*r) for r in run) <= 20_000 for run in runs)


def test_a_full_audit_queue_drops_and_counts_never_silently():
    gate, drops = threading.Event(), []
    writer = BatchWriter(lambda items: gate.wait(10), name="t-audit", max_pending=3,
                         on_drop=lambda reason, n: drops.append((reason, n)))
    try:
        added = [writer.add(i) for i in range(20)]
        assert added.count(False) >= 16 and writer.dropped == added.count(False)
        assert sum(n for reason, n in drops if reason == "queue_full") == writer.dropped
    finally:
        gate.set()
        writer.close()
    failing = BatchWriter(lambda items: 1 / 0, name="t-fail", on_drop=lambda reason, n: drops.append((reason, n)))
    failing.add("row")
    failing.flush()
    failing.close()
    assert ("write_failed", 1) in drops and failing.dropped == 1


def test_the_gateway_exposes_the_audit_drop_counter(env):
    text = httpx.get(env["gw"].url + "/metrics", timeout=10).text
    assert "fabric_gateway_audit_dropped" in text


# --- the caller's x-request-id ------------------------------------------------------------------

def test_the_callers_x_request_id_is_replaced_not_forwarded_first():
    from gateway.proxy import upstream_headers

    out = upstream_headers([(b"x-request-id", b"caller-chosen"), (b"x-other", b"1")], b"gw-0001")
    assert [v for k, v in out if k == b"x-request-id"] == [b"gw-0001"] and (b"x-other", b"1") in out


# --- bodies that trickle, calls per key, the route cache ----------------------------------------

@pytest.fixture(scope="module")
def slow_env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "security-slow")
    engine = sim_engine()
    publish_endpoint(store, "chat", [engine])
    gw = GatewayProcess.start(state, url, {**ENV, "FABRIC_GATEWAY_BODY_SECS": "1",
                                           "FABRIC_GATEWAY_CALLS_PER_KEY": "2"})
    keys = {name: make_key(store, "chat")[1] for name in ("one", "two")}
    yield {"store": store, "gw": gw, "keys": keys, "engine": engine}
    gw.stop()
    engine.stop()
    store.close()


def _trickle(gw, key: str, sent: bytes = b'{"model": "s') -> socket.socket:
    """A connection whose authenticated request declares 100 body bytes and sends a few."""
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=15)
    s.sendall(b"POST /api/ai/openai/chat/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
              b"authorization: Bearer " + key.encode() + b"\r\ncontent-type: application/json\r\n"
              b"content-length: 100\r\n\r\n" + sent)
    return s


def _answer(s: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_a_trickled_body_is_cut_at_the_deadline(slow_env):
    with _trickle(slow_env["gw"], slow_env["keys"]["one"]) as s:
        answer = _answer(s)  # nothing more is sent: the gateway answers when the deadline passes
    assert answer.startswith(b"HTTP/1.1 408"), answer


def test_a_key_has_a_cap_on_calls_in_progress(slow_env):
    gw, keys = slow_env["gw"], slow_env["keys"]
    held = [_trickle(gw, keys["two"]) for _ in range(2)]
    try:
        third = post(slow_env, "two", {"model": "sim-m", **CHAT})  # a third call of the same key
        assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_calls"
        other = post(slow_env, "one", {"model": "sim-m", **CHAT})
        assert other.status_code == 200, other.text
    finally:
        for s in held:
            s.close()


def test_the_route_cache_keeps_authenticated_paths_only(tmp_path):
    from gateway.assemble import create_app
    from gateway.settings import load

    store = open_store(f"sqlite://{tmp_path}/r.db")
    app = create_app(load({}), store, b"secret", "gw-unit")

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            for i in range(50):
                r = await client.post(f"/api/ai/openai/ep{i}/v1/chat/completions", json={})
                assert r.status_code == 401

    try:
        asyncio.run(scenario())
        assert len(app._routes) == 0  # anonymous callers never fill the cache
    finally:
        app.state.audit.close()
        store.close()


def test_a_failure_the_gateway_did_not_expect_is_logged_with_its_traceback(tmp_path, caplog):
    """A bug in a call's stages aborts the call (audited 500 "error"); the log names the request and
    where it failed, which the HTTP server alone would not (it logs an aborted response at debug)."""
    from gateway.assemble import create_app
    from gateway.settings import load

    store = open_store(f"sqlite://{tmp_path}/r.db")
    app = create_app(load({}), store, b"secret", "gw-unit")

    async def broken(c):
        raise RuntimeError("a stage that breaks")

    app._authenticate = broken

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            with pytest.raises(RuntimeError, match="a stage that breaks"):
                await client.post("/api/ai/openai/ep/v1/chat/completions", json={})

    try:
        with caplog.at_level(logging.ERROR, logger="fabric.gateway"):
            asyncio.run(scenario())
    finally:
        app.state.audit.close()
        store.close()
    failed = [r for r in caplog.records if "failed inside the gateway" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info and "a stage that breaks" in str(failed[0].exc_info[1])


# --- a valid pipelined request before a malformed one --------------------------------------------

def test_a_pipelined_request_keeps_its_answer_when_a_malformed_one_follows(env):
    key = env["keys"]["plain"].encode()
    body = json.dumps({"model": "sim-m", **CHAT}).encode()
    good = (b"POST /api/ai/openai/chat/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + key +
            b"\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", env["gw"].port), timeout=15) as s:
        s.sendall(good + b"NOT HTTP AT ALL\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):  # the gateway closes after the refusal
            out += chunk
    first, _, rest = out.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200"), out[:300]
    assert b"HTTP/1.1 400" in rest and rest.index(b"HTTP/1.1 400") > 0
