"""WebSocket calls on the proxy path: authenticated like HTTP, then bridged to the upstream.

The upstream socket is opened before the client's upgrade is accepted (on the first target, and
on the next once if that one does not open: a VIP nobody answers falls back to a ready replica),
so a refused upstream answers 502 (and a refused key 401/403, a full stream cap 429) as a plain HTTP response through
the ASGI websocket.http.response extension. After that, frames are pumped both ways until
either side closes; the stream slot is held for exactly that long. The model scope of a key is
checked against the ``model`` query parameter (a socket has no JSON body to read it from), read
from the raw query string, which is also exactly what the upstream receives: the path comes from
gateway.routes (an encoded '?' in the path is refused), a second ``model`` parameter is refused,
and the upstream URI is the raw path plus the raw query.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from urllib.parse import parse_qs

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from common.errors import FabricError
from gateway.http_io import error_body, request_headers
from gateway.key_auth import check_model, presented_id
from gateway.limits import RequestFacts, plan_admission
from gateway.proxy import UpstreamFailed
from gateway.request_body import valid_model
from gateway.routes import BadPath, check_served, parse_route
from gateway.upstreams import order_targets

NOT_FORWARDED = {"host", "authorization", "api-key", "x-api-key", "upgrade", "connection", "sec-websocket-key",
                 "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-accept", "content-length",
                 "x-request-id"}  # the gateway's own request id goes instead


async def deny(scope, send, exc: FabricError) -> None:
    body = error_body(exc)
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": exc.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


async def _client_to_upstream(receive, upstream) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        if msg["type"] == "websocket.receive":
            data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
            await upstream.send(data)


async def _upstream_to_client(send, upstream) -> None:
    try:
        async for data in upstream:
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})
    except ConnectionClosed:
        pass


def query_model(query: bytes) -> str | None:
    """The ``model`` parameter of a raw query string; a second one, or a non-ASCII query, is 400."""
    try:
        text = query.decode("ascii")
    except UnicodeDecodeError:
        raise BadPath("the query string is not ASCII") from None
    values = parse_qs(text, keep_blank_values=True).get("model", [])
    if len(values) > 1:
        raise BadPath("the query names model more than once")
    return values[0] if values else None


async def _open_upstream(targets: list[str], target: str, fwd: list, ssl_ctx):
    """Open the upstream WebSocket on the first target; a failure to open (nothing was relayed
    yet) moves to the next target once, as the HTTP proxy does: a VIP that does not answer
    falls back to a ready replica."""
    tries = targets[:2]
    for i, base in enumerate(tries):
        try:
            return await connect(base + target, additional_headers=fwd, open_timeout=10, ssl=ssl_ctx)
        except Exception as exc:  # noqa: BLE001 - any failure to open (TLS, handshake, refusal) is the upstream's
            if i + 1 == len(tries):
                raise UpstreamFailed(f"the upstream refused the WebSocket ({type(exc).__name__})") from None
    raise UpstreamFailed("the endpoint has no upstream to try")


async def bridge(state, scope, receive, send) -> None:
    t0 = time.perf_counter()
    request_id, identity, admission, status = uuid.uuid4().hex, None, None, 500
    model, endpoint, label = None, "", "unknown"
    try:
        if (await receive())["type"] != "websocket.connect":
            return
        query = scope.get("query_string", b"")
        route = parse_route(scope.get("raw_path") or scope["path"].encode(), query, "GET")
        endpoint = route.endpoint
        if not endpoint:  # the root /v1 routes by a body's model; a WebSocket has none to read first
            raise BadPath("WebSockets take the per-endpoint path /api/ai/openai/{endpoint}/v1/...")
        headers = request_headers(scope["headers"])
        model = valid_model(query_model(query))
        try:
            identity = await state.auth.identify(headers, endpoint)
        except FabricError as exc:
            state.audit.record_refusal(request_id=request_id, key_id=presented_id(headers), endpoint=endpoint,
                                       status=exc.status, reason=exc.code)
            raise
        check_served(route.path)
        check_model(identity, model, route.path, "GET")
        state.audit.record("ATTEMPT", request_id=request_id, key_id=identity.subject, tenant=identity.tenant,
                           endpoint=endpoint, model=model)
        view = await state.upstreams.view(endpoint)
        label = endpoint
        rec = identity.record
        facts = RequestFacts(endpoint=endpoint, model=model or "unknown", tenant=identity.tenant,
                             project=headers.get("x-project-id"), user=headers.get("x-user-id"),
                             gateway_id=state.gateway_id, prompt_chars=0, max_tokens=None, caller=identity.subject,
                             key_id=rec.id if rec else None, request_quota=rec.request_quota if rec else None,
                             key_max_concurrent=rec.max_concurrent if rec else None)
        plan = [r for r in plan_admission(state.settings, facts) if not r.tokens]
        if plan:
            admission = await state.limits.admit(plan, 0)
        state.limits.count_use(facts)
        tls = state.settings.backend_tls.enabled
        targets = order_targets(view, headers.get("x-session-id"), "wss" if tls else "ws")
        fwd = [(k, v) for k, v in headers.items() if k not in NOT_FORWARDED and not k.startswith("sec-websocket")]
        fwd.append(("x-request-id", request_id))
        upstream = await _open_upstream(targets, route.target.decode("ascii"), fwd, state.backend_ssl)
        async with upstream:
            await send({"type": "websocket.accept"})
            status = 101
            pumps = [asyncio.ensure_future(_client_to_upstream(receive, upstream)),
                     asyncio.ensure_future(_upstream_to_client(send, upstream))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
            with contextlib.suppress(Exception):  # the client already went away
                await send({"type": "websocket.close", "code": 1000})
    except FabricError as exc:
        status = exc.status
        await deny(scope, send, exc)
    finally:
        if admission is not None:
            await asyncio.shield(state.limits.release(admission))
        if identity is not None:
            state.audit.record("SUCCESS" if status == 101 else "FAILED", request_id=request_id,
                               key_id=identity.subject, tenant=identity.tenant, endpoint=endpoint, model=model,
                               status=status, tokens=0, latency_ms=round((time.perf_counter() - t0) * 1000, 3),
                               reason="websocket")
        state.metrics.outcome(label, "success" if status == 101 else "refused")
