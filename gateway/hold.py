"""Holding calls while a replica starts (issue 51): one wake per endpoint, bounded waiting rooms,
keep-alive for held streams.

``Wake``: while any call for an endpoint is held there is exactly one task polling its view and
keeping its demand fresh (gateway.cold_start.record_demand); every held call awaits the same
future, so a hundred held calls cost one poll and one demand write per period, not a hundred.
The task ends when a replica is ready (the future carries the view) or when the last held call
leaves (time out, cancelled, client gone).

``HoldRoom``: at most ``per_endpoint`` held calls per endpoint and ``per_tenant`` per tenant (a
tenant-less caller is its own tenant) in this process; a call beyond either is refused at once
with 503 model_loading and Retry-After. A call's place is given back in a finally, so a held call
whose client leaves (its task is cancelled) releases it.

``HeldStream``: a streamed call that is held gets its SSE head at once and a comment line
(``: keep-alive``, which SSE clients, the openai SDK's included, skip) every ``keepalive_s``, so
proxies and clients with read timeouts do not give up. Its head has gone, so what follows goes
into the stream: the upstream's 200 head is swallowed, and an error answer (the hold ran out, a
limit refused) becomes one OpenAI-shaped ``data: {"error": ...}`` event, with no ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.request_body import loads

KEEPALIVE = b": keep-alive\n\n"


@dataclass(frozen=True)
class HoldPolicy:
    # FABRIC_GATEWAY_HOLD_SECS; None: each endpoint's runtime start budget (gateway.cold_start.hold_bound);
    # an endpoint's hold_secs overrides either; 0: never hold
    secs: float | None = None
    per_endpoint: int = 256  # FABRIC_GATEWAY_HOLD_PER_ENDPOINT
    per_tenant: int = 64  # FABRIC_GATEWAY_HOLD_PER_TENANT
    keepalive_s: float = 10.0  # FABRIC_GATEWAY_HOLD_KEEPALIVE_SECS


class Wake:
    """One endpoint's poller while calls are held for it."""

    def __init__(self, poll: Callable[[], Awaitable[object | None]], refresh: Callable[[], Awaitable[None]],
                 every_s: float):
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.held = 0
        self.every_s = every_s
        self._task = asyncio.create_task(self._run(poll, refresh, every_s))

    async def _run(self, poll, refresh, every_s: float) -> None:
        try:
            while True:
                await asyncio.sleep(every_s)
                view = await poll()
                if view is not None:
                    self.ready.set_result(view)
                    return
                await refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the endpoint went away, the store failed: every held call learns it
            if not self.ready.done():
                self.ready.set_exception(exc)

    async def wait(self, until: float, ping: Callable[[], Awaitable[None]] | None, ping_s: float,
                   now: Callable[[], float] = time.monotonic):
        """The view once ready; None when ``until`` (read on ``now``) passes first. The clock is
        read again at least once a poll period, so a clock that jumps is seen within one."""
        pinged = now()
        while (left := until - now()) > 0:
            step = min(left, self.every_s, ping_s - (now() - pinged)) if ping else min(left, self.every_s)
            done, _ = await asyncio.wait({self.ready}, timeout=max(0.0, step))
            if done:
                return self.ready.result()
            if ping is not None and until - now() > 0 and now() - pinged >= ping_s:
                pinged = now()
                await ping()
        return None

    def stop(self) -> None:
        self._task.cancel()
        if self.ready.done() and not self.ready.cancelled():
            self.ready.exception()  # retrieved: no "never retrieved" warning for an unawaited error


@dataclass
class HoldRoom:
    policy: HoldPolicy
    wakes: dict[str, Wake] = field(default_factory=dict)
    tenants: dict[str, int] = field(default_factory=dict)

    def full(self, endpoint: str, tenant: str) -> str | None:
        """Why one more held call does not fit, or None."""
        wake = self.wakes.get(endpoint)
        if wake is not None and wake.held >= self.policy.per_endpoint:
            return f"{self.policy.per_endpoint} calls are already waiting for this endpoint's replica"
        if self.tenants.get(tenant, 0) >= self.policy.per_tenant:
            return f"{self.policy.per_tenant} of your calls are already waiting for a replica"
        return None

    def enter(self, endpoint: str, tenant: str, start: Callable[[], Wake]) -> Wake:
        wake = self.wakes.get(endpoint)
        if wake is None or wake.ready.done():
            wake = self.wakes[endpoint] = start()
        wake.held += 1
        self.tenants[tenant] = self.tenants.get(tenant, 0) + 1
        return wake

    def leave(self, endpoint: str, tenant: str, wake: Wake) -> None:
        wake.held -= 1
        left = self.tenants.get(tenant, 0) - 1
        if left > 0:
            self.tenants[tenant] = left
        else:
            self.tenants.pop(tenant, None)
        if wake.held <= 0:
            wake.stop()
            if self.wakes.get(endpoint) is wake:
                del self.wakes[endpoint]


class HeldStream:
    """The ASGI send of a streamed call that was held (see the module docstring)."""

    def __init__(self, send, headers: list | None = None):
        self._send = send
        self._headers = headers or []  # the call's own (x-fabric-request-id), on the early head
        self.opened = False
        self._error: int | None = None  # the status of an error answer being turned into an event
        self._body = bytearray()

    async def open(self) -> None:
        if not self.opened:
            self.opened = True
            await self._send({"type": "http.response.start", "status": 200,
                              "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
                                          *self._headers]})
        await self._send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})

    async def __call__(self, message: dict) -> None:
        if not self.opened:
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            status = message.get("status", 200)
            self._error = status if status >= 400 else None
            return
        if self._error is None:
            await self._send(message)
            return
        self._body += message.get("body", b"")
        if not message.get("more_body", False):
            await self._send({"type": "http.response.body", "body": error_event(self._error, bytes(self._body)),
                              "more_body": False})


def error_event(status: int, body: bytes) -> bytes:
    """An error answer as the stream's last event: its OpenAI error object when it has one."""
    try:
        obj = loads(body)
    except ValueError:
        obj = None
    if not (isinstance(obj, dict) and isinstance(obj.get("error"), dict)):
        obj = {"error": {"message": body.decode(errors="replace")[:500] or f"status {status}",
                         "type": "upstream_error", "code": status}}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
