"""The playground's chat: POST /app/ai/endpoints/{name}/try/chat {"prompt", "max_tokens"} (CSRF header).

The console asks the REST API for a playground key for the signed-in user (POST
/api/ai/endpoints/{name}/playground-key, controlplane.api.playground_keys: scoped to this
endpoint and its model, a few requests, expiring after KEY_TTL_S), sends the chat through the
gateway clients use (FABRIC_CONSOLE_GATEWAY_URL + /api/ai/openai/{name}/v1/chat/completions,
streamed, with the usage chunk), relays it to the browser as server-sent events, names the
replica that answered (the answer's x-fabric-replica header, else the gateway's explanation
GET /api/ai/explain/request/{id}) and revokes the key (DELETE .../playground-key/{id}) when the
answer ends, whatever the outcome. The key never reaches the browser, a log or an event text.
A viewer gets a key only where the endpoint's key policy sets viewer_playground; elsewhere the
API's 403 playground_refused is what the page shows.

Events sent: `token` {"text"}, `done` {"ttft_ms", "tokens_per_s", "completion_tokens", "usage",
"replica", "replica_source", "request_id", "elapsed_ms"}, `error` {"status", "code", "message"}.
"""

from __future__ import annotations

import functools
import json
import logging
import ssl
import time
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from common.errors import Forbidden
from controlplane.console import session as sessions
from controlplane.console.backend import Api, ApiError
from controlplane.console.render import PREFIX, session_of
from controlplane.ops.keys import PLAYGROUND_TTL_S
from controlplane.state import get_state

router = APIRouter(prefix=PREFIX, include_in_schema=False)
log = logging.getLogger("fabric.console.playground")
KEY_TTL_S = PLAYGROUND_TTL_S
MAX_PROMPT = 8000
MAX_TOKENS = 1024
GATEWAY_TIMEOUT_S = 120


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _error(status: int, code: str, message: str) -> bytes:
    return _sse("error", {"status": status, "code": code, "message": message[:500]})


async def _body(request: Request) -> dict:
    try:
        data = json.loads((await request.body())[:64 * 1024] or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


@router.post("/endpoints/{name}/try/chat")
async def chat(request: Request, name: str):
    session = session_of(request)
    if session is None:
        return JSONResponse({"error": {"code": "unauthorized", "message": "sign in again"}}, status_code=401)
    try:
        sessions.check_csrf(request, session, {})
    except Forbidden as exc:
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=403)
    body = await _body(request)
    prompt = str(body.get("prompt", "")).strip()
    try:
        max_tokens = max(1, min(MAX_TOKENS, int(body.get("max_tokens", 64))))
    except (TypeError, ValueError):
        return JSONResponse({"error": {"code": "invalid", "message": "max_tokens: expected a whole number"}},
                            status_code=422)
    if not prompt or len(prompt) > MAX_PROMPT:
        return JSONResponse({"error": {"code": "invalid", "message": f"prompt: 1 to {MAX_PROMPT} characters"}},
                            status_code=422)
    config = get_state(request).settings
    api = Api(request, session)
    return StreamingResponse(_relay(api, config.gateway_url, name, prompt, max_tokens, config.gateway_ca),
                             media_type="text/event-stream", headers={"Cache-Control": "no-store"})


async def _relay(api: Api, gateway: str, endpoint: str, prompt: str, max_tokens: int, ca: str = ""):
    if not gateway:
        yield _error(503, "no_gateway", "the playground needs FABRIC_CONSOLE_GATEWAY_URL (the gateway clients use)")
        return
    where = f"/api/ai/endpoints/{quote(endpoint, safe='')}/playground-key"
    try:
        minted = await api.call("POST", where)
    except ApiError as exc:
        yield _error(exc.status, exc.code, f"no playground key: {exc.message}")
        return
    key, key_id = minted["key"], minted["id"]
    try:
        model = await served_model(api, endpoint)
        async for chunk in _chat(gateway, endpoint, model, key, prompt, max_tokens, ca):
            yield chunk
    finally:
        try:
            await api.call("DELETE", f"{where}/{quote(key_id, safe='')}")
        except ApiError as exc:  # it still expires after KEY_TTL_S
            log.warning("playground key %s not revoked: %s %s", key_id, exc.status, exc.code)


async def served_model(api: Api, endpoint: str) -> str:
    """The model name clients send: the endpoint's deployment's model (the endpoint's name if unknown)."""
    try:
        ep = await api.get(f"/api/ai/endpoints/{quote(endpoint, safe='')}")
        dep = await api.get(f"/api/ai/deployments/{quote(ep['deployment'], safe='')}")
        return str(dep.get("model") or endpoint)
    except (ApiError, KeyError):
        return endpoint


@functools.cache
def _gateway_tls(ca: str) -> ssl.SSLContext:
    """One TLS context per CA file (a setting read at start), not one per playground call."""
    return ssl.create_default_context(cafile=ca)


async def _chat(gateway: str, endpoint: str, model: str, key: str, prompt: str, max_tokens: int, ca: str = ""):
    url = f"{gateway}/api/ai/openai/{quote(endpoint, safe='')}/v1/chat/completions"
    payload = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
               "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {key}"}
    start = time.monotonic()
    first = None
    pieces, usage, request_id = 0, None, ""
    try:
        verify = _gateway_tls(ca) if ca else True  # FABRIC_CONSOLE_GATEWAY_CA
        async with httpx.AsyncClient(timeout=GATEWAY_TIMEOUT_S, verify=verify) as client:
            async with client.stream("POST", url, json=payload, headers=headers) as resp:
                request_id = resp.headers.get("x-fabric-request-id", "")
                named = resp.headers.get("x-fabric-replica", "")  # gateway.proxy: the replica that answered
                if resp.status_code >= 400:
                    raw = (await resp.aread())[:4000]
                    try:
                        err = json.loads(raw).get("error", {})
                    except ValueError:
                        err = {}
                    yield _error(resp.status_code, str(err.get("code", "error")),
                                 str(err.get("message", raw.decode("utf-8", "replace")[:300])))
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        continue
                    if "error" in chunk:
                        err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                        yield _error(502, str(err.get("code", "upstream")), str(err.get("message", "")))
                        return
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content") or ""
                        if text:
                            if first is None:
                                first = time.monotonic()
                            pieces += 1
                            yield _sse("token", {"text": text})
            replica = named or await _replica(client, gateway, key, request_id)
    except httpx.HTTPError as exc:
        yield _error(502, "gateway_unreachable", f"the gateway at {gateway} did not answer: {type(exc).__name__}")
        return
    end = time.monotonic()
    tokens = (usage or {}).get("completion_tokens") or pieces
    gen_s = end - (first or end)
    yield _sse("done", {"ttft_ms": round(1000 * ((first or end) - start), 1), "elapsed_ms": round(1000 * (end - start), 1),
                        "tokens_per_s": round(tokens / gen_s, 1) if gen_s > 0 and tokens > 1 else None,
                        "completion_tokens": tokens, "usage": usage, "replica": replica, "model": model,
                        "replica_source": "x-fabric-replica" if named else "explanation" if replica else "",
                        "request_id": request_id})


async def _replica(client: httpx.AsyncClient, gateway: str, key: str, request_id: str) -> str | None:
    """The replica the gateway chose, from its explanation of this request (for this key only)."""
    if not request_id:
        return None
    try:
        resp = await client.get(f"{gateway}/api/ai/explain/request/{quote(request_id, safe='')}",
                                headers={"Authorization": f"Bearer {key}"}, timeout=5)
        found = resp.json() if resp.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return None
    for k in ("chosen", "replica", "replica_id"):
        if isinstance(found.get(k), str):
            return found[k]
    if found.get("mode"):  # affinity routing: the VIP's Maglev chose, the gateway names no replica
        return f"not named by the gateway ({found['mode']}: {found.get('reason', '')})"
    return None
