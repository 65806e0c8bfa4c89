"""The request plumbing under the proxy path, kept out of the call flow in gateway.app: header
reading (one value per interpreted header), the capped streaming body read, error responses,
and running the upstream call while watching for the client to leave."""

from __future__ import annotations

import asyncio
import json
import re

from common.errors import FabricError, InvalidInput, LimitExceeded, PayloadTooLarge, Unauthorized
from common.task_cancel import uncancel
from gateway.openai_errors import openai_status

# Headers the gateway reads: a second copy would let the gateway and the engine read different
# values (Starlette's Headers.get takes the first, a dict the last), so it is refused.
INTERPRETED = frozenset({
    b"content-type", b"authorization", b"api-key", b"x-api-key", b"x-user-id", b"x-project-id",
    b"x-session-id", b"x-request-priority", b"x-request-timeout", b"content-length", b"transfer-encoding",
})
# x-user-id and x-project-id name store counters: short, and from a safe alphabet.
COUNTER_NAME = re.compile(r"^[A-Za-z0-9._@:+-]{1,128}$")


class BadHeader(FabricError):
    status = 400
    code = "invalid_header"


def request_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for k, v in raw:
        name = k.decode("latin-1").lower()
        if name in headers and k.lower() in INTERPRETED:
            raise BadHeader(f"the {name} header is sent more than once")
        headers[name] = v.decode("latin-1")
    for name in ("x-user-id", "x-project-id"):
        value = headers.get(name)
        if value is not None and not COUNTER_NAME.match(value):
            raise BadHeader(f"{name} must be 1-128 characters of letters, digits and ._@:+-")
    return headers


class ClientGone(Exception):
    pass


def error_body(exc: FabricError) -> bytes:
    # OpenAI's error shape ({message, type, code}) which also meets ours ({code, message}).
    return json.dumps({"error": {"message": exc.message, "type": exc.code, "code": exc.code}}).encode()


async def send_json(send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] = ()) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, exc: FabricError, close: bool = False, request_id: str | None = None) -> None:
    """close: the body was not read, so the connection cannot carry another request (the server
    closes it after this response instead of reading what the client still sends). request_id:
    named in x-fabric-request-id, so a refusal can be explained (GET /api/ai/explain/request/)."""
    extra = [(b"connection", b"close")] if close else []
    if request_id is not None:
        extra.append((b"x-fabric-request-id", request_id.encode()))
    retry_after = getattr(exc, "retry_after", None)  # LimitExceeded, Contended, cold_start.ModelLoading
    if retry_after is not None:
        extra.append((b"retry-after", str(max(1, round(retry_after))).encode()))
    extra.extend(getattr(exc, "headers", ()))  # LimitExceeded from gateway.limits: x-ratelimit-*
    await send_json(send, openai_status(exc), error_body(exc), extra)


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


async def run_unless_client_leaves(coro, receive, guard=None):
    """Run coro in this task; if the client disconnects first, cancel it (which closes the
    upstream) and raise ClientGone. guard: the server's disconnect guard (gateway.http_server
    puts one in scope["extensions"]), which cancels this task itself (its ``task``: the task
    running the request, which is this one). Without one: one watcher
    task per call, no asyncio.wait: the watcher cancels this task directly. uvicorn's receive() also answers http.disconnect once the
    response is complete, but by then coro has returned and the watcher is cancelled before it
    runs (uvicorn's send never suspends after marking the response complete)."""
    if guard is not None:
        task = guard.task or asyncio.current_task()
        guard.watch(task)
        try:
            return await coro
        except asyncio.CancelledError:
            if guard.disconnected:
                uncancel(task)
                raise ClientGone() from None
            raise
        finally:
            guard.watch(None)
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
            uncancel(task)
            raise ClientGone() from None
        raise
    finally:
        watcher.cancel()


