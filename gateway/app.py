"""The gateway as a raw ASGI app: the hot path skips a framework's routing and validation layers.

Routes:
  /api/ai/openai/{endpoint}/{path...}   the OpenAI proxy (HTTP, or WebSocket when upgraded)
  /metrics                              Prometheus text
  /health                               liveness
A call: read the body (capped), authenticate, audit ATTEMPT, resolve the endpoint, shed, check
caps, reserve limits, proxy while watching for the client to leave, then settle tokens, free
slots and audit SUCCESS/FAILED in a finally that a disconnect cannot skip.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from prometheus_client import CONTENT_TYPE_LATEST

from common.errors import FabricError, InvalidInput, LimitExceeded, PayloadTooLarge, Unauthorized
from common.store.base import Store
from gateway import dry_run
from gateway.audit import AuditWriter
from gateway.key_auth import Authenticator, Identity
from gateway.limits import Admission, LimitKeeper, RequestFacts, check_caps, plan_admission
from gateway.metrics import GatewayMetrics
from gateway.proxy import UpstreamBroke, UpstreamTimeout, forward, upstream_headers
from gateway.request_body import BodyInfo, parse_body
from gateway.settings import GatewaySettings
from gateway.telemetry import Tracer
from gateway.upstreams import UpstreamCache, check_shed, order_targets

if TYPE_CHECKING:
    from common.http1_client import UpstreamPool

log = logging.getLogger("fabric.gateway")
PREFIX = "/api/ai/openai/"
PRIORITIES = ("low", "normal", "high")


class ClientGone(Exception):
    pass


@dataclass
class GatewayState:
    settings: GatewaySettings
    store: Store
    auth: Authenticator
    limits: LimitKeeper
    upstreams: UpstreamCache
    audit: AuditWriter
    metrics: GatewayMetrics
    client: UpstreamPool
    tracer: Tracer
    gateway_id: str

    @property
    def scheme(self) -> str:
        return "https" if self.settings.backend_tls.enabled else "http"


def error_body(exc: FabricError) -> bytes:
    # OpenAI's error shape ({message, type, code}) which also meets ours ({code, message}).
    return json.dumps({"error": {"message": exc.message, "type": exc.code, "code": exc.code}}).encode()


async def send_json(send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] = ()) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, exc: FabricError) -> None:
    extra = []
    if isinstance(exc, LimitExceeded):
        extra.append((b"retry-after", str(max(1, round(exc.retry_after))).encode()))
    await send_json(send, exc.status, error_body(exc), extra)


async def read_body(receive, headers: dict[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body is over the gateway's limit of {limit} bytes "
                              "(FABRIC_GATEWAY_MAX_BODY; FABRIC_GATEWAY_MAX_UPLOAD for /v1/files)")
    chunks, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone()
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body is over the gateway's limit of {limit} bytes "
                                  "(FABRIC_GATEWAY_MAX_BODY; FABRIC_GATEWAY_MAX_UPLOAD for /v1/files)")
        chunks.append(chunk)
        if not msg.get("more_body"):
            return b"".join(chunks)


PREFIX_B = PREFIX.encode()


def upstream_target(scope, subpath: str) -> bytes:
    """The upstream request-target: the raw path below /api/ai/openai/{endpoint} as the client
    sent it (percent-escapes kept), plus the query string."""
    raw = scope.get("raw_path")
    if raw and raw.startswith(PREFIX_B):
        target = b"/" + raw[len(PREFIX_B):].partition(b"/")[2]
    else:
        target = quote(subpath, safe="/:@!$&'()*+,;=-._~%").encode()
    qs = scope.get("query_string")
    return target + b"?" + qs if qs else target


def request_timeout(headers: dict[str, str], default: float) -> float:
    raw = headers.get("x-request-timeout")
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput("x-request-timeout must be a number of seconds from 1 to 300") from None
    if not 1 <= value <= 300:
        raise InvalidInput("x-request-timeout must be from 1 to 300 seconds")
    return value


def outcome_of(exc: Exception) -> str:
    if isinstance(exc, Unauthorized):
        return "unauthorized"
    if isinstance(exc, LimitExceeded):
        return "rate_limited"
    if isinstance(exc, FabricError) and exc.status < 500:
        return "refused"
    return "upstream_error"


async def run_unless_client_leaves(coro, receive):
    """Run coro in this task; if the client disconnects first, cancel it (which closes the
    upstream) and raise ClientGone. One watcher task per call, no asyncio.wait: the watcher
    cancels this task directly. uvicorn's receive() also answers http.disconnect once the
    response is complete, but by then coro has returned and the watcher is cancelled before it
    runs (uvicorn's send never suspends after marking the response complete)."""
    task = asyncio.current_task()
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        return await coro
    except asyncio.CancelledError:
        if gone:
            task.uncancel()
            raise ClientGone() from None
        raise
    finally:
        watcher.cancel()


class GatewayApp:
    def __init__(self, state: GatewayState):
        self.state = state
        # Request ids: a random per-process prefix and a counter (uuid4 costs a getrandom()
        # syscall per call, which was ~8% of the hot path's CPU). Same 32-hex-character shape.
        self._id_prefix = os.urandom(8).hex()
        self._id_seq = itertools.count(1)

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if path.startswith(PREFIX):
                endpoint, _, rest = path[len(PREFIX):].partition("/")
                await self.call(scope, receive, send, unquote(endpoint), "/" + rest)
            elif path == "/metrics":
                body = self.state.metrics.exposition()
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode())]})
                await send({"type": "http.response.body", "body": body})
            elif path in ("/health", "/healthz"):
                await send_json(send, 200, b'{"status":"ok"}')
            else:
                await send_json(send, 404, b'{"error":{"code":"not_found","message":"no such route","type":"not_found"}}')
        elif kind == "websocket":
            from gateway.websocket_bridge import bridge

            await bridge(self.state, scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive, send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                self.state.client.close()
                self.state.audit.close()
                self.state.tracer.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def call(self, scope, receive, send, endpoint: str, subpath: str) -> None:
        st = self.state
        t0 = time.perf_counter()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request_id = f"{self._id_prefix}{next(self._id_seq):016x}"
        label, status, tokens, outcome = "unknown", 500, None, "error"
        identity: Identity | None = None
        admission: Admission | None = None
        info = BodyInfo()
        try:
            # Batch input files are uploaded whole; they get their own, larger cap.
            cap = st.settings.max_upload if subpath.startswith("/v1/files") else st.settings.max_body
            body = await read_body(receive, headers, cap)
            info = parse_body(body, headers.get("content-type", ""))
            identity = await st.auth.authenticate(headers, endpoint, info.model, subpath)
            label = endpoint
            st.audit.record("ATTEMPT", request_id=request_id, key_id=identity.subject, tenant=identity.tenant,
                            endpoint=endpoint, model=info.model)
            deadline = request_timeout(headers, st.settings.total_deadline_secs)
            priority = headers.get("x-request-priority", "normal").lower()
            if priority not in PRIORITIES:
                raise InvalidInput("x-request-priority must be low, normal or high")
            if st.settings.dry_run:
                status, tokens = await dry_run.respond(send, info, endpoint)
                outcome = "success"
                return
            view = await st.upstreams.view(endpoint)
            check_shed(view, st.settings.shed_queue, priority)
            rec = identity.record
            facts = RequestFacts(
                endpoint=endpoint, model=info.model or "unknown", tenant=identity.tenant,
                project=headers.get("x-project-id"), user=headers.get("x-user-id"), gateway_id=st.gateway_id,
                prompt_chars=info.prompt_chars, max_tokens=info.max_tokens,
                key_id=rec.id if rec else None, request_quota=rec.request_quota if rec else None,
                key_tokens_per_minute=rec.tokens_per_minute if rec else None,
                key_max_concurrent=rec.max_concurrent if rec else None,
            )
            check_caps(st.settings, facts)
            plan = plan_admission(st.settings, facts)
            if plan:
                admission = await st.limits.admit(plan, facts.token_estimate)
            targets = order_targets(view, headers.get("x-session-id") or info.prompt_head or None, st.scheme)
            target = upstream_target(scope, subpath)
            fwd_headers = upstream_headers(scope["headers"], request_id.encode())
            in_flight = st.metrics.in_flight_for(endpoint)
            in_flight.inc()
            try:
                async with asyncio.timeout(deadline):
                    result = await run_unless_client_leaves(
                        forward(st.client, send, targets, scope["method"], target, fwd_headers, body, info.stream),
                        receive)
            finally:
                in_flight.dec()
            status, tokens = result.status, result.tokens
            outcome = "success" if result.ok else "upstream_error"
            if result.ttft_s is not None:
                st.metrics.ttft_for(endpoint).observe(result.ttft_s)
        except ClientGone:
            status, outcome = 499, "client_closed"
        except UpstreamBroke:
            status, outcome = 502, "upstream_error"
            raise  # aborts the connection, so the client sees a truncated response
        except TimeoutError:
            status, outcome = 504, "upstream_error"
            await self._send_fabric_error(send, UpstreamTimeout("the upstream deadline passed"))
        except FabricError as exc:
            status, outcome = exc.status, outcome_of(exc)
            await self._send_fabric_error(send, exc)
        finally:
            await self._finish(identity, admission, info, request_id, endpoint, label, status, tokens, outcome, t0)

    async def _send_fabric_error(self, send, exc: FabricError) -> None:
        try:
            await send_error(send, exc)
        except (RuntimeError, OSError):
            log.debug("could not send an error body; the response had started")

    async def _finish(self, identity, admission, info, request_id, endpoint, label, status, tokens, outcome, t0):
        st = self.state
        elapsed = time.perf_counter() - t0
        counted = tokens if tokens is not None else (info.max_tokens or 1)
        if admission is not None:
            # Shielded: a client that leaves must still free its slot and settle its tokens.
            await asyncio.shield(self._settle(admission, counted if outcome == "success" else (tokens or 0)))
        if identity is not None:
            kind = "SUCCESS" if outcome == "success" else "FAILED"
            st.audit.record(kind, request_id=request_id, key_id=identity.subject, tenant=identity.tenant,
                            endpoint=endpoint, model=info.model, status=status,
                            tokens=tokens or 0, latency_ms=round(elapsed * 1000, 3), reason=outcome)
        st.metrics.outcome(label, outcome, elapsed)
        if tokens:
            models = await st.upstreams.known_models() if label != "unknown" else frozenset()
            st.metrics.tokens_for(label, info.model if info.model in models else "unknown").inc(tokens)
        st.tracer.span(endpoint=label, status=status, tokens=tokens or 0, seconds=elapsed)
        if outcome != "success":
            log.info("request %s endpoint=%s status=%s outcome=%s", request_id, label, status, outcome)

    async def _settle(self, admission: Admission, tokens: int) -> None:
        try:
            await self.state.limits.settle(admission, tokens)
        finally:
            await self.state.limits.release(admission)
