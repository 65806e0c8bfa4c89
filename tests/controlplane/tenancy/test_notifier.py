"""Notifications to a real HTTP receiver on loopback (controlplane.tenancy.notifier): signed JSON
and Slack-shaped bodies, retries while the receiver is down (refusing connections, then answering
503) until it takes the notification, de-duplication by event id, and the operator alerts."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn

from common import budgets, keyspace
from common.notifications import Notification, Webhook
from common.records import budgets as budget_records
from common.records import notifications as notification_records
from common.records import usage_docs
from common.records import webhooks as webhook_records
from common.records.backup_status import BackupStatus, record_success
from common.schemas import Node, Replica
from common.store import open_store
from common.usage_ledger import Dims
from controlplane.tenancy import alerts, notifier
from gateway.usage_ledger import Call, UsageLedger
from lab.rigs.polling import wait_for

SECRET = "s3cret-for-signing-0123"


class Receiver:
    """An ASGI webhook receiver: records (headers, body) of each POST; answers ``status``."""

    def __init__(self) -> None:
        self.got: list[tuple[dict, bytes]] = []
        self.status = 200

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.got.append(({k.decode(): v.decode() for k, v in scope["headers"]}, body))
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@contextmanager
def serve_on(app, port: int):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    def started() -> bool:
        assert thread.is_alive()
        return server.started

    wait_for(started, 20, "uvicorn to start", interval=0.02)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite://{tmp_path}/fabric.db")
    yield s
    s.close()


def hook(port: int, **kw) -> Webhook:
    return Webhook(name=kw.pop("name", "ops"), url=f"http://127.0.0.1:{port}/hook", secret=SECRET,
                   updated_at=kw.pop("updated_at", 1000.0), **kw)


def note(event_id: str = "budget-acme-1-80", at: float = 2000.0, **kw) -> Notification:
    return Notification(id=event_id, kind=kw.pop("kind", "budget"), title="budget acme at 80%",
                        message="acme used 80%", tenant=kw.pop("tenant", "acme"), created_at=at, **kw)


def verify(headers: dict, body: bytes) -> bool:
    want = hmac.new(SECRET.encode(), headers["x-fabric-timestamp"].encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest(headers["x-fabric-signature"], "sha256=" + want.hexdigest())


def tick(store, now: float):
    async def run():
        n = notifier.Notifier(store)
        try:
            return await n.tick(now)
        finally:
            await n.aclose()
    return asyncio.run(run())


def test_a_receiver_down_for_a_while_gets_the_notification_once_it_is_back(store):
    port = closed_port()
    webhook_records.put(store, hook(port))
    assert notification_records.raise_once(store, note())
    assert not notification_records.raise_once(store, note())  # the same id again (another gateway): nothing new
    t = 2000.0
    [first] = tick(store, t)  # nothing listens: refused
    assert not first.ok and "no answer" in first.error
    d = notification_records.require(store, "budget-acme-1-80").deliveries["ops"]
    assert (d.state, d.attempts, d.next_at) == ("pending", 1, t + notifier.backoff(1))
    assert tick(store, t + 1) == []  # not due yet: backoff
    receiver = Receiver()
    receiver.status = 503
    with serve_on(receiver, port):
        [second] = tick(store, t + 2)  # listening, but unhealthy
        assert not second.ok and "503" in second.error
        assert notification_records.require(store, "budget-acme-1-80").deliveries["ops"].next_at == t + 2 + 4
        receiver.status = 200
        [third] = tick(store, t + 6)
        assert third.ok
        assert tick(store, t + 600) == []  # delivered: never again
    assert len(receiver.got) == 2  # the 503 and the delivery, both with the same event id
    assert {h["x-fabric-event-id"] for h, _ in receiver.got} == {"budget-acme-1-80"}
    headers, body = receiver.got[-1]
    assert verify(headers, body) and json.loads(body)["title"] == "budget acme at 80%"
    d = notification_records.require(store, "budget-acme-1-80").deliveries["ops"]
    assert (d.state, d.attempts) == ("delivered", 3)


def test_slack_body_filters_and_giving_up(store):
    receiver = Receiver()
    port = closed_port()
    webhook_records.put(store, hook(port, name="slack", format="slack"))
    webhook_records.put(store, hook(port, name="beta-only", tenant="beta"))  # another tenant's: not sent
    webhook_records.put(store, hook(port, name="late", updated_at=5000.0))  # came after the notification
    notification_records.raise_once(store, note())
    with serve_on(receiver, port):
        [out] = tick(store, 2000.0)
    assert out.webhook == "slack" and out.ok
    headers, body = receiver.got[0]
    assert json.loads(body) == {"text": "[warning] budget acme at 80%: acme used 80%"} and verify(headers, body)
    notification_records.raise_once(store, note("budget-acme-1-100"))
    now = 2000.0
    for _ in range(notifier.MAX_ATTEMPTS):  # nobody listens any more
        tick(store, now)
        now += notifier.MAX_BACKOFF_S
    d = notification_records.require(store, "budget-acme-1-100").deliveries["slack"]
    assert (d.state, d.attempts) == ("failed", notifier.MAX_ATTEMPTS)


def test_notify_test_sends_one_signed_test_to_each_webhook(store):
    receiver = Receiver()
    port = closed_port()
    with serve_on(receiver, port):
        out = asyncio.run(notifier.send_test(store, [hook(port)], 3000.0))
    assert [o.ok for o in out] == [True]
    headers, body = receiver.got[0]
    assert verify(headers, body) and json.loads(body)["kind"] == "test"
    assert notification_records.list(store) == []  # nothing stored


def test_budget_thresholds_raise_one_notification_each_however_many_gateways(store):
    store.put(keyspace.budgets("acme-day"), budgets.Budget(name="acme-day", tenant="acme", period="day", limit=100,
                                                           action="refuse").model_dump_json())
    now = time.time()
    gateways = [UsageLedger(store, f"gw-{i}", flush_s=0.01) for i in range(2)]
    call = Call(now, Dims("acme", "k1", "chat", "m", None, "success"), 30, 15, 0)
    try:
        for i in range(3):  # 45, 90 (80% crossed), 135 (100% crossed)
            gateways[i % 2].record(call)
            gateways[i % 2].flush()
    finally:
        for g in gateways:
            g.close()
    start = budgets.period_bounds("day", now)[0]
    ids = sorted(n.id for n in notification_records.list(store))
    assert ids == [f"budget-acme-day-{start}-100", f"budget-acme-day-{start}-80"]
    assert budget_records.spent(store, budgets.Budget(name="acme-day", tenant="acme", period="day", limit=100), now) == 135
    rows = [r for d in usage_docs.docs(store) for r in d.rows]
    assert sorted((r.key, r.calls) for r in rows) == [("k1", 1), ("k1", 2)]  # one row per gateway


def test_operator_alerts_node_silent_and_backup_old(store):
    now = 100_000.0
    nodes = [Node(id="n1", address="https://127.0.0.1:1", last_heartbeat=now - 400),
             Node(id="n2", address="https://127.0.0.1:2", last_heartbeat=now - 10),
             Node(id="idle", address="https://127.0.0.1:3", last_heartbeat=now - 9000)]
    got = alerts.raised(nodes, {"n1": 2, "n2": 1}, now - 3600, now)
    assert [n.id for n in got] == [f"alert-node-silent-n1-{int(now - 400)}"]  # idle holds no replica
    got = alerts.raised([], {}, now - 27 * 3600, now)
    assert [n.data["alert"] for n in got] == ["FabricBackupTooOld"]
    # The worker raises them from the store, once per incident, and delivers them.
    store.put(keyspace.nodes("n1"), nodes[0].model_copy(update={"last_heartbeat": time.time() - 400}).model_dump_json())
    rep = Replica(replica_id="r0", deployment="d", ordinal=0, node="n1")
    store.put(keyspace.replicas("d", "r0"), rep.model_dump_json())
    record_success(store, BackupStatus(at=time.time(), archive="a.tar", bytes=1, host="h", store_keys=1))
    receiver = Receiver()
    port = closed_port()
    webhook_records.put(store, hook(port, updated_at=0.0))
    worker = notifier.NotifyWorker(store, alerts=True, retention_s=86400)

    async def twice():
        try:
            return [await worker.tick(), await worker.tick()]
        finally:
            await worker.aclose()
    with serve_on(receiver, port):
        first, second = asyncio.run(twice())
    assert [o.ok for o in first] == [True] and second == []
    assert json.loads(receiver.got[0][1])["data"]["alert"] == "FabricNodeNotHeartbeating"
