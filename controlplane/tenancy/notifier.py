"""Delivering notifications (common.notifications) to webhooks: fabricd's notify pass, run by the
leader every FABRIC_NOTIFY_SECS (controlplane.controllers), and ``POST /api/ai/notify/test``.

Each pass: list the notifications and webhooks once; ``due`` (pure) says which (notification,
webhook) pairs to try now; each is POSTed (at most CONCURRENCY at once, TIMEOUT_S each) with the
signature headers; the outcomes are written back onto each notification with one
compare-and-swap per notification. A failure (no answer, or a status other than 2xx) is retried
after ``backoff(attempts)`` (2, 4, 8 ... seconds, at most MAX_BACKOFF_S) until MAX_ATTEMPTS, then
marked failed. Delivery is at least once: a pass that dies after a POST and before writing the
outcome sends it again on the next pass with the same ``X-Fabric-Event-Id``, which the receiver
uses to drop the repeat. A notification is created only for webhooks that existed when it was
raised (a new webhook does not receive the past), and is pruned KEEP_S after it was raised.

Signature: ``X-Fabric-Signature: sha256=`` + hex HMAC-SHA256(secret, timestamp + "." + body), with
``X-Fabric-Timestamp`` (whole seconds): a receiver recomputes it and refuses an old timestamp.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass

import httpx

from common.notifications import Delivery, Notification, Webhook
from common.records import nodes as node_records
from common.records import notifications as notification_records
from common.records import replicas as replica_records
from common.records import usage_docs, webhooks
from common.records.backup_status import last_success
from common.store.base import Store
from controlplane.tenancy import alerts

log = logging.getLogger("fabric.notify")

MAX_ATTEMPTS = 12
MAX_BACKOFF_S = 300.0
TIMEOUT_S = 5.0
CONCURRENCY = 16
KEEP_S = 7 * 86400.0
USER_AGENT = "fabric-notify/1"


def backoff(attempts: int) -> float:
    return min(MAX_BACKOFF_S, 2.0 ** attempts)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def body_for(webhook: Webhook, n: Notification) -> bytes:
    if webhook.format == "slack":
        return json.dumps({"text": n.slack_text()}).encode()
    return json.dumps(n.payload(), sort_keys=True).encode()


def headers_for(webhook: Webhook, n: Notification, body: bytes, now: float) -> dict[str, str]:
    ts = int(now)
    return {"content-type": "application/json", "user-agent": USER_AGENT, "x-fabric-event-id": n.id,
            "x-fabric-timestamp": str(ts), "x-fabric-signature": sign(webhook.secret, ts, body)}


def due(notes: list[Notification], hooks: list[Webhook], now: float) -> list[tuple[Notification, Webhook]]:
    """Pure: the deliveries to try now."""
    out = []
    for n in notes:
        for w in hooks:
            d = n.deliveries.get(w.name)
            if d is None:
                if not w.takes(n) or w.updated_at > n.created_at + 1:
                    continue  # not this webhook's kind, or the webhook came after the notification
            elif d.state != "pending" or d.next_at > now:
                continue
            out.append((n, w))
    return out


@dataclass(frozen=True)
class Outcome:
    notification: str
    webhook: str
    ok: bool
    error: str = ""


async def post(client: httpx.AsyncClient, webhook: Webhook, n: Notification, now: float) -> Outcome:
    body = body_for(webhook, n)
    try:
        r = await client.post(webhook.url, content=body, headers=headers_for(webhook, n, body, now),
                              timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        return Outcome(n.id, webhook.name, False, f"{type(exc).__name__}: no answer from the receiver")
    if 200 <= r.status_code < 300:
        return Outcome(n.id, webhook.name, True)
    return Outcome(n.id, webhook.name, False, f"the receiver answered {r.status_code}")


def advanced(d: Delivery | None, outcome: Outcome, now: float) -> Delivery:
    """Pure: a delivery after one attempt."""
    d = d or Delivery()
    attempts = d.attempts + 1
    if outcome.ok:
        return Delivery(state="delivered", attempts=attempts, delivered_at=now)
    if attempts >= MAX_ATTEMPTS:
        return Delivery(state="failed", attempts=attempts, last_error=outcome.error)
    return Delivery(state="pending", attempts=attempts, next_at=now + backoff(attempts), last_error=outcome.error)


class Notifier:
    """One per leader; ``tick`` is one pass."""

    def __init__(self, store: Store, client: httpx.AsyncClient | None = None,
                 on_outcome=None) -> None:
        self.store = store
        self._client = client or httpx.AsyncClient(follow_redirects=False)
        self._on_outcome = on_outcome  # (webhook, ok) -> None: the metric

    async def aclose(self) -> None:
        await self._client.aclose()

    async def tick(self, now: float | None = None) -> list[Outcome]:
        now = time.time() if now is None else now
        notes = await asyncio.to_thread(notification_records.list, self.store)
        hooks = await asyncio.to_thread(webhooks.list, self.store)
        for n in notes:
            if now - n.created_at > KEEP_S:
                await asyncio.to_thread(notification_records.discard, self.store, n.id)
        notes = [n for n in notes if now - n.created_at <= KEEP_S]
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(n: Notification, w: Webhook) -> Outcome:
            async with gate:
                return await post(self._client, w, n, now)

        outcomes = await asyncio.gather(*(one(n, w) for n, w in due(notes, hooks, now)))
        by_note: dict[str, list[Outcome]] = {}
        for o in outcomes:
            by_note.setdefault(o.notification, []).append(o)
            if not o.ok:
                log.warning("notification %s to webhook %s: %s", o.notification, o.webhook, o.error)
            if self._on_outcome is not None:
                self._on_outcome(o.webhook, o.ok)
        for note_id, done in by_note.items():
            await asyncio.to_thread(self._write_back, note_id, done, now)
        return outcomes

    def _write_back(self, note_id: str, done: list[Outcome], now: float) -> None:
        def mutate(n: Notification) -> Notification:
            deliveries = dict(n.deliveries)
            for o in done:
                deliveries[o.webhook] = advanced(deliveries.get(o.webhook), o, now)
            return n.model_copy(update={"deliveries": deliveries})

        notification_records.update(self.store, note_id, mutate)


async def send_test(store: Store, hooks: list[Webhook], now: float, client: httpx.AsyncClient | None = None
                    ) -> list[Outcome]:
    """``fabricctl ai notify test``: one signed test notification to each webhook now (one attempt,
    the answer says what each receiver did); nothing is stored."""
    n = Notification(id=f"test-{int(now * 1000)}", kind="test", severity="info", title="test notification",
                     message="fabricctl ai notify test: this webhook receives Fabric's notifications", created_at=now)
    own = client is None
    client = client or httpx.AsyncClient(follow_redirects=False)
    try:
        return list(await asyncio.gather(*(post(client, w, n, now) for w in hooks)))
    finally:
        if own:
            await client.aclose()


class NotifyWorker:
    """The leader's notify pass (controlplane.controllers, every FABRIC_NOTIFY_SECS): raise the
    operator alerts when asked (controlplane.tenancy.alerts), deliver what is due, and at most once
    an hour compact and prune the usage ledger (common.usage_ledger)."""

    COMPACT_EVERY_S = 3600.0

    def __init__(self, store: Store, *, alerts: bool, retention_s: float, notifier: Notifier | None = None):
        self.store = store
        self.alerts = alerts
        self.retention_s = retention_s
        self.notifier = notifier or Notifier(store)
        self._compacted_at = float("-inf")

    async def tick(self, now: float | None = None) -> list[Outcome]:
        now = time.time() if now is None else now
        if self.alerts:
            await asyncio.to_thread(self._raise_alerts, now)
        outcomes = await self.notifier.tick(now)
        if now - self._compacted_at >= self.COMPACT_EVERY_S:
            await asyncio.to_thread(usage_docs.compact, self.store, now, self.retention_s)
            self._compacted_at = now
        return outcomes

    def _raise_alerts(self, now: float) -> None:
        per_node: dict[str, int] = {}
        for r in replica_records.readable(self.store):
            if isinstance(r.get("node"), str):
                per_node[r["node"]] = per_node.get(r["node"], 0) + 1
        backup = last_success(self.store)
        for n in alerts.raised(node_records.list(self.store), per_node, backup.at if backup else None, now):
            notification_records.raise_once(self.store, n)

    async def aclose(self) -> None:
        await self.notifier.aclose()
