"""WebSocket calls on the proxy path: authenticated like HTTP, then bridged to the upstream.

The upstream socket is opened before the client's upgrade is accepted, so a refused upstream
answers 502 (and a refused key 401/403, a full stream cap 429) as a plain HTTP response through
the ASGI websocket.http.response extension. After that, frames are pumped both ways until
either side closes; the stream slot is held for exactly that long. The model scope of a key is
checked against the ``model`` query parameter (a socket has no JSON body to read it from).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from urllib.parse import parse_qs, unquote

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from common.errors import FabricError, NotFound
from gateway.app import error_body
from gateway.assemble import backend_ssl
from gateway.limits import RequestFacts, plan_admission
from gateway.proxy import UpstreamFailed
from gateway.upstreams import order_targets

PREFIX = "/api/ai/openai/"
NOT_FORWARDED = {"host", "authorization", "api-key", "x-api-key", "upgrade", "connection", "sec-websocket-key",
                 "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-accept", "content-length"}


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


async def bridge(state, scope, receive, send) -> None:
    t0 = time.perf_counter()
    path = scope["path"]
    request_id, identity, admission, status = uuid.uuid4().hex, None, None, 500
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    query = scope.get("query_string", b"").decode("latin-1")
    model = (parse_qs(query).get("model") or [None])[0]
    endpoint = ""
    try:
        if (await receive())["type"] != "websocket.connect":
            return
        if not path.startswith(PREFIX):
            raise NotFound("no such route")
        endpoint, _, rest = path[len(PREFIX):].partition("/")
        endpoint = unquote(endpoint)
        identity = await state.auth.authenticate(headers, endpoint, model)
        state.audit.record("ATTEMPT", request_id=request_id, key_id=identity.subject, tenant=identity.tenant,
                           endpoint=endpoint, model=model)
        view = await state.upstreams.view(endpoint)
        rec = identity.record
        facts = RequestFacts(endpoint=endpoint, model=model or "unknown", tenant=identity.tenant,
                             project=headers.get("x-project-id"), user=headers.get("x-user-id"),
                             gateway_id=state.gateway_id, prompt_chars=0, max_tokens=None,
                             key_id=rec.id if rec else None, request_quota=rec.request_quota if rec else None,
                             key_max_concurrent=rec.max_concurrent if rec else None)
        plan = [r for r in plan_admission(state.settings, facts) if not r.tokens]
        if plan:
            admission = await state.limits.admit(plan, 0)
        tls = state.settings.backend_tls.enabled
        targets = order_targets(view, headers.get("x-session-id"), "wss" if tls else "ws")
        fwd = [(k, v) for k, v in headers.items() if k not in NOT_FORWARDED and not k.startswith("sec-websocket")]
        uri = targets[0] + "/" + rest + ("?" + query if query else "")
        try:
            upstream = await connect(uri, additional_headers=fwd, open_timeout=10,
                                     ssl=backend_ssl(state.settings.backend_tls) if tls else None)
        except Exception as exc:  # noqa: BLE001 - any failure to open (TLS, handshake, refusal) is the upstream's
            raise UpstreamFailed(f"the upstream refused the WebSocket ({type(exc).__name__})") from None
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
        state.metrics.outcome(endpoint if identity else "unknown", "success" if status == 101 else "refused")
