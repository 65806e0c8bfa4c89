"""GET /api/ai/usage, prices, budgets, webhooks and notify test through fabricd on loopback (real
HTTP, a real SQLite store), and the same through the real `fabricctl` console script."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import time

import pytest

from common import budgets, usage_ledger
from common.records import budgets as budget_records
from common.records import usage_docs
from common.schemas import InferenceEndpoint, Replica
from common.store import open_store
from common.usage_ledger import UsageDoc, UsageRow
from controlplane.orchestration_state import put_replica
from tests.controlplane.conftest import BIN
from tests.controlplane.tenancy.test_notifier import Receiver, closed_port, serve_on, verify
from tests.support.inprocess_fabricd import serve_fabricd

_HOUR = usage_ledger.hour_of(time.time()) - 3 * 3600
# The two hours the fixture fills must share a UTC day (the day rollup counts them as one row):
# between 03:00 and 04:00 UTC the hour three back is 23:00 of the day before.
HOUR = _HOUR - 3600 if usage_ledger.day_of(_HOUR) != usage_ledger.day_of(_HOUR + 3600) else _HOUR


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("usage")
    store = open_store(f"sqlite://{tmp}/fabric.db")
    rows = [UsageRow(tenant="acme", key="k1", endpoint="chat", model="m7", calls=3, input_tokens=1000,
                     output_tokens=500, cached_tokens=400),
            UsageRow(tenant="beta", key="k2", endpoint="chat", model="m7", calls=1, input_tokens=100,
                     output_tokens=400, status="upstream_error")]
    usage_docs.put(store, UsageDoc(span="hour", start=HOUR, source="gw-a", rows=rows[:1]))
    usage_docs.put(store, UsageDoc(span="hour", start=HOUR, source="gw-b", rows=rows[1:]))
    usage_docs.put(store, UsageDoc(span="hour", start=HOUR + 3600, source="gw-a", rows=rows[:1]))
    store.put("/fabric/endpoints/chat", InferenceEndpoint(name="chat", deployment="chat-dep").model_dump_json())
    # chat-dep: 2 GPUs ready for the whole first hour -> 7200 GPU-s, split 1500:500 by tokens
    rep = Replica(replica_id="chat-0", deployment="chat-dep", ordinal=0, node="n", gpus=["a", "b"],
                  created_at=HOUR - 10)
    put_replica(store, rep, HOUR - 10)
    put_replica(store, rep.model_copy(update={"ready": True, "ready_since": HOUR - 5}), HOUR - 5)
    put_replica(store, rep.model_copy(update={"ready": False}), HOUR + 3600)
    with serve_fabricd(store, tmp) as (client, _state):
        yield client, store
    store.close()


def test_usage_per_tenant_with_gpu_seconds_and_cost(served):
    api, _ = served
    assert api.put("/api/ai/prices", json={"gpu_hour": 2.0, "models": {
        "m7": {"input_per_mtok": 1.0, "output_per_mtok": 4.0, "cached_per_mtok": 0.5}}}).status_code == 200
    r = api.get("/api/ai/usage", params={"since": HOUR, "until": HOUR + 7200, "group_by": "tenant",
                                         "granularity": "total"})
    assert r.status_code == 200, r.text
    rows = {row["tenant"]: row for row in r.json()["rows"]}
    acme, beta = rows["acme"], rows["beta"]
    assert (acme["calls"], acme["input_tokens"], acme["output_tokens"], acme["cached_tokens"]) == (6, 2000, 1000, 800)
    assert acme["gpu_seconds"] == pytest.approx(7200 * 1500 / 2000, abs=0.01)  # hour 1's share; hour 2 had no GPU
    assert beta["gpu_seconds"] == pytest.approx(7200 * 500 / 2000, abs=0.01)
    # acme: (1200 input at 1 + 800 cached at 0.5 + 1000 output at 4) / 1e6 + 5400 GPU-s at 2/hour
    assert acme["cost"] == pytest.approx((1200 + 400 + 4000) / 1e6 + 3.0, abs=1e-6)
    assert r.json()["currency"] == "USD" and r.json()["totals"]["calls"] == 7
    hourly = api.get("/api/ai/usage", params={"since": HOUR, "until": HOUR + 7200, "group_by": "model,status",
                                              "tenant": "acme"}).json()
    assert [(row["start"], row["model"], row["calls"]) for row in hourly["rows"]] == [(HOUR, "m7", 3),
                                                                                      (HOUR + 3600, "m7", 3)]
    text = api.get("/api/ai/usage", params={"since": HOUR, "until": HOUR + 7200, "format": "csv",
                                            "granularity": "day"}).text
    table = list(csv.DictReader(io.StringIO(text)))
    assert {(t["tenant"], t["calls"]) for t in table} == {("acme", "6"), ("beta", "1")}
    for bad in ({"group_by": "password"}, {"since": HOUR, "until": HOUR - 1}, {"granularity": "week"}):
        r = api.get("/api/ai/usage", params=bad)
        assert r.status_code in (400, 422) and "error" in r.json(), (bad, r.text)


def test_budgets_show_their_spend_and_refuse_bad_input(served):
    api, store = served
    r = api.post("/api/ai/budgets", json={"name": "acme-month", "tenant": "acme", "limit": 1000, "action": "refuse"})
    assert r.status_code == 201, r.text
    budget_records.add(store, budgets.Budget.model_validate(r.json()), 850, time.time())
    [row] = api.get("/api/ai/budgets").json()
    assert (row["spent"], row["percent"], row["refusing"]) == (850, 85.0, False)
    for bad in ({"name": "x", "limit": 5}, {"name": "x", "tenant": "acme", "limit": 0},
                {"name": "x", "tenant": "acme", "limit": 5, "metric": "bytes"}):
        assert api.post("/api/ai/budgets", json=bad).status_code == 422, bad
    assert api.delete("/api/ai/budgets/acme-month").status_code == 200
    assert api.get("/api/ai/budgets").json() == []
    assert budget_records.spent(store, budgets.Budget.model_validate(r.json()), time.time()) == 0
    assert api.delete("/api/ai/budgets/acme-month").status_code == 404


def test_webhooks_hide_their_secret_and_notify_test_reaches_a_receiver(served, tmp_path):
    api, store = served
    receiver, port = Receiver(), closed_port()
    secret = "s3cret-for-signing-0123"
    r = api.post("/api/ai/webhooks", json={"name": "ops", "url": f"http://127.0.0.1:{port}/h", "secret": secret})
    assert r.status_code == 201 and "secret" not in r.json()
    assert secret not in api.get("/api/ai/webhooks").text
    assert api.post("/api/ai/webhooks", json={"name": "bad", "url": "file:///etc/passwd",
                                              "secret": secret}).status_code == 422
    r = api.post("/api/ai/notify/test")
    assert r.json()["results"][0]["delivered"] is False  # nothing listens yet
    with serve_on(receiver, port):
        assert api.post("/api/ai/notify/test").json()["results"] == [{"webhook": "ops", "delivered": True,
                                                                     "error": None}]
        # fabricctl: the same through the console script, token from the environment
        token = api.headers["authorization"].split()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        env.update(FABRIC_URL=str(api.base_url).rstrip("/"), FABRIC_TOKEN=token, HOME=str(tmp_path))

        def ctl(*args):
            proc = subprocess.run([str(BIN / "fabricctl"), "ai", *args], capture_output=True, text=True, env=env,
                                  timeout=60)
            assert proc.returncode == 0, proc.stderr
            return proc.stdout

        assert "ops: delivered" in ctl("notify", "test")
        out = ctl("usage", "--since", str(HOUR), "--until", str(HOUR + 7200), "--by", "tenant",
                  "--granularity", "total", "--csv")
        assert out.splitlines()[0].startswith("start,tenant,calls")
        table = ctl("usage", "--since", str(HOUR), "--until", str(HOUR + 7200), "--by", "model")
        assert "CALLS" in table and "total: 7 calls" in table
        (tmp_path / "s").write_text(secret + "\n")
        ctl("webhook", "set", "slack", "--url", f"http://127.0.0.1:{port}/s", "--secret-file", str(tmp_path / "s"),
            "--format", "slack")
        assert "slack" in ctl("webhook", "list") and secret not in ctl("webhook", "list", "--json")
        ctl("budget", "set", "k1-day", "--key", "k1", "--limit", "5", "--metric", "cost", "--period", "day",
            "--action", "refuse")
        assert json.loads(ctl("budget", "list", "--json"))[0]["metric"] == "cost"
        ctl("prices", "set", "--model", "m8=1:2")
        assert set(json.loads(ctl("prices", "show", "--json"))["models"]) == {"m7", "m8"}
    assert all(verify(h, b) for h, b in receiver.got)
