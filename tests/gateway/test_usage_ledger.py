"""The usage ledger and budgets through a real gateway process in front of the simulated engine
(gateway.usage_ledger): a refusing budget answers 429 naming itself once spent, every call of a
burst is in the ledger after a clean stop, and a full queue drops and counts."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest

from common import budgets, keyspace
from common.records import notifications as notification_records
from common.records import usage_docs
from common.store import open_store
from common.usage_ledger import Dims
from gateway.usage_ledger import Call, UsageLedger, split
from lab.rigs.polling import wait_for
from tests.gateway.gateway_harness import GatewayProcess, make_key, publish_endpoint, sim_engine, sqlite_state


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    state, url, store = sqlite_state(tmp_path_factory, "ledger")
    engine = sim_engine("--replica-id", "ledger-rep")
    publish_endpoint(store, "billed", [engine])
    yield {"store": store, "state": state, "url": url}
    engine.stop()
    store.close()


def chat(gw: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(gw.openai_base("billed") + "/chat/completions", timeout=15,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": "sim-m", "messages": [{"role": "user", "content": "hello there"}],
                            "max_tokens": 4})


def ledger_calls(store, key_id: str) -> int:
    return sum(r.calls for d in usage_docs.docs(store) for r in d.rows if r.key == key_id)


def test_a_refusing_budget_answers_429_naming_it_once_spent(env):
    store = env["store"]
    key_id, key = make_key(store, "billed", tenant="spender")
    budget = budgets.Budget(name="spender-day", tenant="spender", period="day", limit=10, action="refuse")
    store.put(keyspace.budgets(budget.name), budget.model_dump_json())
    gw = GatewayProcess.start(env["state"], env["url"], {"FABRIC_GATEWAY_CACHE_SECS": "0.2"}, gateway_id="gw-budget")
    try:
        assert chat(gw, key).status_code == 200  # under the limit: served, then charged (> 10 tokens)
        r = wait_for(lambda: r if (r := chat(gw, key)).status_code == 429 else None, 15, "the budget to refuse",
                     interval=0.1)
        err = r.json()["error"]
        assert err["code"] == "budget_exceeded" and err["type"] == "budget_exceeded"
        assert "spender-day" in err["message"] and int(r.headers["retry-after"]) >= 1
        other_id, other = make_key(store, "billed", tenant="saver")  # another tenant is not refused
        assert chat(gw, other).status_code == 200
    finally:
        gw.stop()
    start = budgets.period_bounds("day", time.time())[0]
    ids = {n.id for n in notification_records.list(store)}
    assert {f"budget-spender-day-{start}-80", f"budget-spender-day-{start}-100"} <= ids
    rows = [r for d in usage_docs.docs(store) for r in d.rows if r.key == key_id]
    assert {r.status for r in rows} >= {"success", "rate_limited"}


def test_a_clean_stop_loses_no_usage_record(env):
    store = env["store"]
    key_id, key = make_key(store, "billed", tenant="burst")
    gw = GatewayProcess.start(env["state"], env["url"], gateway_id="gw-burst")
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: chat(gw, key).status_code, range(40)))
        assert codes == [200] * 40
        assert "fabric_gateway_usage_dropped_total{" not in httpx.get(gw.url + "/metrics").text  # none dropped
    finally:
        gw.stop()  # SIGTERM straight after the burst: the ledger's last batch is written on the way out
    assert "Application shutdown complete" in gw.log_text()  # (uvicorn re-raises SIGTERM after it)
    assert ledger_calls(store, key_id) == 40


def test_made_up_model_names_do_not_grow_the_usage_document(env):
    """An attacker with a key names a fresh model on every call: each is refused, and each is
    recorded under one "unknown" row, so the hour's usage document stays one row long."""
    store = env["store"]
    key_id, key = make_key(store, "billed", tenant="namer")
    gw = GatewayProcess.start(env["state"], env["url"], gateway_id="gw-namer")
    try:
        for i in range(12):
            r = httpx.post(gw.openai_base("billed") + "/chat/completions", timeout=15,
                           headers={"authorization": f"Bearer {key}"},
                           json={"model": f"made-up-{i}", "messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 1})
            assert r.status_code >= 400, r.text
    finally:
        gw.stop()
    rows = [r for d in usage_docs.docs(store) for r in d.rows if r.key == key_id]
    assert sum(r.calls for r in rows) == 12
    assert {r.model for r in rows} == {"unknown"}


def test_a_full_queue_drops_and_counts(tmp_path):
    store = open_store(f"sqlite://{tmp_path}/f.db")
    dropped: list[tuple[str, int]] = []
    ledger = UsageLedger(store, "gw-small", flush_s=3600, max_pending=3, on_drop=lambda why, n: dropped.append((why, n)))
    try:
        for _ in range(5):
            ledger.record(Call(time.time(), Dims("t", "k", "e", "m", None, "success"), 1, 1, 0))
        assert ledger.dropped == 2 and dropped == [("queue_full", 1), ("queue_full", 1)]
    finally:
        ledger.close()  # writes the three it kept
    assert sum(r.calls for d in usage_docs.docs(store) for r in d.rows) == 3
    store.close()


def test_split_takes_the_engines_figures_or_the_prompt_estimate():
    from gateway.request_body import usage_tokens

    engine = usage_tokens({"usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                                     "prompt_tokens_details": {"cached_tokens": 16}}})
    assert engine == 42 and split(engine, 999) == (30, 12, 16)
    assert split(42, 10) == (10, 32, 0) and split(5, 10) == (5, 0, 0)
    responses = usage_tokens({"response": {"usage": {"input_tokens": 7, "output_tokens": 3}}})
    assert responses == 10 and split(responses, 0) == (7, 3, 0)
