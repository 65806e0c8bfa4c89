"""Pure parts of the gateway and its shared modules, on plain data and a real SQLite store:
audit chain tamper detection, counters, settings validation, target order, shedding, body parsing."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import pytest

from common import audit_chain, keyspace
from common.records import counters
from common.schemas import EndpointStatus, InferenceEndpoint, Replica
from gateway import settings as gs
from gateway.limits import RequestFacts, plan_admission, window_clock
from gateway.request_body import SseUsageScanner, parse_body
from gateway.routes import parse_route
from gateway.upstreams import EndpointView, order_targets, should_shed
from gateway.usage import UsageCounter


def test_audit_chain_detects_edited_inserted_and_deleted_rows(store):
    chain = audit_chain.AuditChain(store)
    for i in range(5):
        chain.append("ATTEMPT", request_id=f"r{i}", endpoint="chat")
    assert audit_chain.verify(store).ok and audit_chain.verify(store).rows == 5
    key = keyspace.audit(f"{3:012d}")
    original = store.get(key).value
    store.put(key, original.replace('"r2"', '"r9"'))  # an edit that keeps the stored hash
    bad = audit_chain.verify(store)
    assert not bad.ok and bad.bad_seq == 3 and "altered" in bad.reason
    entry = audit_chain.parse_entry(original)  # re-sealing the edit breaks the next link instead
    row = {k: v for k, v in entry.rows[0].items() if k not in ("seq", "ts", "prev", "hash")}
    store.put(key, audit_chain.seal(3, entry.prev, 1.0, [dict(row, request_id="r9")])[1])
    bad = audit_chain.verify(store)
    assert not bad.ok and bad.bad_seq == 4 and "link" in bad.reason
    store.put(key, original.replace('{"v":2,"hash":"', '{"hash":"', 1))  # the framing altered
    assert audit_chain.verify(store).bad_seq == 3
    store.put(key, original)
    assert audit_chain.verify(store).ok
    store.delete(keyspace.audit(f"{2:012d}"))
    assert audit_chain.verify(store).bad_seq == 2
    with pytest.raises(ValueError):
        chain.append("ATTEMPT", prompt="never")


def test_a_batch_is_one_entry_and_every_row_of_it_is_checked(store):
    chain = audit_chain.AuditChain(store)
    chain.append("ATTEMPT", request_id="a")
    first = chain.append_many([("ATTEMPT", {"request_id": f"b{i}"}) for i in range(4)] + [("SUCCESS", {"status": 200})])
    assert first == 2
    chain.append("FAILED", status=500)
    rows = audit_chain.read_rows(store)
    assert [r["seq"] for r in rows] == list(range(1, 8)) and rows[5]["status"] == 200
    assert len({r["hash"] for r in rows[1:6]}) == 1 and rows[6]["prev"] == rows[5]["hash"]
    assert len(store.list(keyspace.audit())) == 4  # three entries and the tip
    result = audit_chain.verify(store)
    assert result.ok and result.rows == 7
    # A tip naming a row inside the batch checks that batch's hash.
    assert audit_chain.verify(store, audit_chain.Tip(4, rows[3]["hash"])).ok
    assert not audit_chain.verify(store, audit_chain.Tip(4, rows[0]["hash"])).ok
    # Removing the batch's entry: the next entry no longer follows.
    store.delete(keyspace.audit(f"{2:012d}"))
    bad = audit_chain.verify(store)
    assert not bad.ok and bad.bad_seq == 2


def test_a_version_1_chain_still_verifies_and_version_2_extends_it(store):
    """Rows written one per entry before the batch format: each hashed over its canonical JSON."""
    prev = audit_chain.GENESIS
    for seq in (1, 2, 3):
        row = {"seq": seq, "ts": 1764547200.5, "kind": "ATTEMPT", "prev": prev, "request_id": f"old{seq}",
               "endpoint": "chat", "latency_ms": 1.25}
        row["hash"] = prev = audit_chain.row_hash(row)
        store.put(keyspace.audit(f"{seq:012d}"), json.dumps(row))
    store.put(keyspace.audit("tip"), f"3 {prev}")
    assert audit_chain.verify(store).ok
    chain = audit_chain.AuditChain(store)
    assert chain.append_many([("SUCCESS", {"status": 200}), ("FAILED", {"status": 500})]) == 4
    rows = audit_chain.read_rows(store)
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5] and rows[3]["prev"] == prev
    assert audit_chain.verify(store, audit_chain.tip_of(rows)).ok
    old = json.loads(store.get(keyspace.audit(f"{2:012d}")).value)
    store.put(keyspace.audit(f"{2:012d}"), json.dumps(dict(old, endpoint="other")))
    bad = audit_chain.verify(store)
    assert not bad.ok and bad.bad_seq == 2 and "altered" in bad.reason


def test_audit_chain_is_exact_with_several_writers(store):
    chains = [audit_chain.AuditChain(store) for _ in range(4)]
    threads = [threading.Thread(target=lambda c=c: [c.append("SUCCESS", status=200) for _ in range(15)])
               for c in chains]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = audit_chain.verify(store)
    assert result.ok and result.rows == 60


def test_counters_never_over_admit_across_threads(store):
    wins = []

    def worker():
        for _ in range(20):
            if counters.reserve(store, "/c/q", 1, 30).ok:
                wins.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 30 and counters.read(store, "/c/q") == 30
    assert counters.window_reserve(store, "/c/w", 5, 5, 60, now=120.0).ok
    refused = counters.window_reserve(store, "/c/w", 1, 5, 60, now=150.0)
    assert not refused.ok and refused.retry_after == 30
    assert counters.window_reserve(store, "/c/w", 5, 5, 60, now=180.0).ok  # a new window


def test_settings_refuse_partial_mtls_and_bad_numbers(tmp_path):
    with pytest.raises(gs.SettingsError, match="FABRIC_BACKEND_CLIENT_KEY"):
        gs.load({"FABRIC_BACKEND_TLS": "1", "FABRIC_BACKEND_CLIENT_CERT": "/x", "FABRIC_BACKEND_CA": "/y"})
    with pytest.raises(gs.SettingsError, match="FABRIC_USER_RPM"):
        gs.load({"FABRIC_USER_RPM": "lots"})
    with pytest.raises(gs.SettingsError, match="FABRIC_OIDC"):
        gs.load({"FABRIC_OIDC_ISSUER": "https://i"})
    s = gs.load({"FABRIC_TENANT_RPM": "10", "FABRIC_MODEL_TPM": "0", "FABRIC_GATEWAY_STREAMS": "3"})
    assert s.rpm == {"TENANT": 10} and s.tpm == {} and s.streams == {"GATEWAY": 3} and s.max_context == 32768


def test_the_windows_clock_is_the_systems_or_the_file_the_settings_name(tmp_path):
    assert gs.load({}).clock_file is None and window_clock(None) is time.time
    with pytest.raises(gs.SettingsError, match="FABRIC_GATEWAY_CLOCK_FILE"):
        gs.load({"FABRIC_GATEWAY_CLOCK_FILE": str(tmp_path / "absent")})
    (tmp_path / "t").write_text("soon")
    with pytest.raises(gs.SettingsError, match="FABRIC_GATEWAY_CLOCK_FILE"):
        gs.load({"FABRIC_GATEWAY_CLOCK_FILE": str(tmp_path / "t")})
    (tmp_path / "t").write_text("6001.5")
    clock = window_clock(gs.load({"FABRIC_GATEWAY_CLOCK_FILE": str(tmp_path / "t")}).clock_file)
    assert clock() == 6001.5
    (tmp_path / "t").write_text("6061.5")  # read at every call: a test moves every gateway's windows
    assert clock() == 6061.5


def _view(vip: str | None, n: int, depths: dict[str, tuple[float, float]] | None = None) -> EndpointView:
    ep = InferenceEndpoint(name="e", deployment="d", status=EndpointStatus(vip=vip))
    reps = tuple(Replica(replica_id=f"r{i}", deployment="d", ordinal=i, node="n", host=f"10.0.0.{i + 1}",
                         ready=True) for i in range(n))
    return EndpointView(ep, reps, depths or {})


def test_affinity_is_consistent_and_follows_the_vip():
    view = _view(None, 4)
    first = {order_targets(view, f"session-{i}")[0] for i in range(40)}
    assert len(first) > 1  # sessions spread over replicas
    assert order_targets(view, "s1") == order_targets(view, "s1")
    with_vip = order_targets(_view("10.9.9.9", 4), "s1")
    assert with_vip[0] == "http://10.9.9.9:8000" and with_vip[1] == order_targets(view, "s1")[0]


def test_shedding_scales_with_priority_on_any_fresh_reading():
    now = 1000.0
    view = _view(None, 2, {"r0": (3, now), "r1": (1, now)})
    # ANY ready replica over the threshold sheds (the product's rule), scaled by priority.
    assert should_shed(view, 2, "normal", now) and should_shed(view, 2, "low", now)
    assert not should_shed(view, 2, "high", now)
    assert not should_shed(_view(None, 2, {"r0": (1, now), "r1": (1, now)}), 2, "low", now)
    assert not should_shed(view, None, "low", now)
    # A reading 30 s old or more says nothing about the queue now.
    assert not should_shed(_view(None, 2, {"r0": (9, now - 30), "r1": (1, now)}), 2, "normal", now)
    assert should_shed(_view(None, 2, {"r0": (9, now - 29), "r1": (1, now)}), 2, "normal", now)


def test_limit_plan_only_names_configured_scopes():
    facts = RequestFacts(endpoint="e", model="m", tenant=None, project="p", user=None, gateway_id="g",
                         prompt_chars=40, max_tokens=10, key_id="k", request_quota=5)
    plan = plan_admission(gs.load({"FABRIC_TENANT_RPM": "5", "FABRIC_PROJECT_TPM": "100"}), facts)
    assert [r.what for r in plan] == ["the API key's request quota", "FABRIC_PROJECT_TPM"]
    assert plan[1].amount == 20  # 40 chars / 4 + max_tokens


def test_every_key_is_counted_even_without_a_quota(store):
    # Without a quota the count is not an admission step (no store write on the hot path): the
    # plan is empty and gateway.usage adds the calls up in the background, into the same counter
    # a quota reserves on.
    facts = RequestFacts(endpoint="e", model="m", tenant=None, project="p", user=None, gateway_id="g",
                         prompt_chars=40, max_tokens=10, key_id="k")
    assert plan_admission(gs.load({}), facts) == []
    [quota] = plan_admission(gs.load({}), replace(facts, request_quota=5))
    assert (quota.key, quota.amount, quota.limit) == ("/fabric/counters/quota/k", 1, 5)
    usage = UsageCounter(store)
    for _ in range(7):
        usage.count("k")
    usage.count("other")
    usage.flush()
    assert counters.read(store, "/fabric/counters/quota/k") == 7
    assert counters.read(store, "/fabric/counters/quota/other") == 1
    usage.close()
    anonymous = RequestFacts(endpoint="e", model="m", tenant=None, project="p", user=None, gateway_id="g",
                             prompt_chars=40, max_tokens=10)
    assert plan_admission(gs.load({}), anonymous) == []


def test_body_parsing_and_sse_usage_across_chunk_boundaries():
    info = parse_body(json.dumps({"model": "m", "messages": [{"role": "user", "content": "abcd" * 30}],
                                  "max_tokens": 7, "stream": True}).encode(), "application/json",
                      parse_route(b"/api/ai/openai/e/v1/chat/completions", b"", "POST"))
    assert (info.model, info.stream, info.max_tokens, info.prompt_chars, len(info.prompt_head)) == ("m", True, 7, 120, 64)
    scanner = SseUsageScanner()
    event = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}\n\n'
    scanner.feed(b'data: {"choices":[{"delta":{}}]}\n\n' + event[:20])
    scanner.feed(event[20:])
    assert scanner.tokens == 7


def test_loads_answers_what_json_answers():
    """request_body.loads takes orjson's fast path but accepts and parses exactly what json does
    (the engine's reading), including what orjson alone refuses."""
    import json
    import math

    from gateway.request_body import loads

    for body in (b'{"a": 1, "a": 2, "n": 1.5e300, "s": "\\u00e9"}', b'{"big": 123456789012345678901234567890, "neg": -9223372036854775809}',
                 b'{"m": 1e400}', b'\xef\xbb\xbf{"bom": 1}',
                 b'{"x": NaN, "y": -Infinity}', b'{"s": "\\ud800"}', b'[1, {"b": [true, null]}]'):
        got, want = loads(body), json.loads(body)
        assert repr(got) == repr(want) or (math.isnan(got["x"]) and math.isnan(want["x"]))
    with pytest.raises(ValueError):
        loads(b'{"a": ')
