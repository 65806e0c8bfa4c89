"""The HTTP proxy hot path: common.http1_client's keep-alive pool, streamed both ways, never
buffered.

forward() sends the call to the first target; a connect failure moves to the next target once,
only for a non-streaming call (no byte can have arrived when the connection never opened).
The upstream body is relayed chunk by chunk as it arrives (SSE included; chunks already waiting
are sent together); the upstream response is always closed in a finally, so cancelling the task
(the client left, the deadline passed) closes the upstream connection at once. The pool's idle
timeout covers the wait for the response head and every gap between chunks.

When the upstream dies after the response has started, an SSE client gets a final
``data: {"error": ...}`` event (the openai client raises on it); any other client gets a
truncated body (the connection is aborted), so a partial answer is never taken as complete.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from common.errors import FabricError
from common.http1_client import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
)
from gateway.request_body import SseUsageScanner, loads, usage_tokens

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"trailers", b"transfer-encoding", b"upgrade",
})
# Never sent upstream: the caller's credential stays at the gateway; the client sets host/length;
# expect: the gateway already holds the whole body, so a 100-continue handshake has no point.
NOT_FORWARDED = HOP_BY_HOP | {b"authorization", b"api-key", b"x-api-key", b"host", b"content-length", b"expect"}
JSON_KEEP = 1024 * 1024  # non-streamed bodies up to this size are parsed for usage


class UpstreamFailed(FabricError):
    status = 502
    code = "upstream_unavailable"


class UpstreamTimeout(FabricError):
    status = 504
    code = "upstream_timeout"


class UpstreamBroke(Exception):
    """The upstream failed after the response started; the client connection must be aborted."""


@dataclass
class ProxyResult:
    status: int
    tokens: int | None
    ok: bool
    ttft_s: float | None = None
    reason: str = ""


def upstream_headers(raw: list[tuple[bytes, bytes]], request_id: bytes) -> list[tuple[bytes, bytes]]:
    # ASGI servers hand header names over lowercased already.
    out = [(k, v) for k, v in raw if k not in NOT_FORWARDED]
    out.append((b"x-request-id", request_id))
    return out


def client_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    # The upstream client lowercases header names.
    return [(k, v) for k, v in raw if k not in HOP_BY_HOP]


def split_target(url: str) -> tuple[str, str, int]:
    """'http://host:port' (as order_targets makes them) -> (scheme, host, port); cached."""
    hit = _SPLIT.get(url)
    if hit is None:
        scheme, _, rest = url.partition("://")
        host, _, port = rest.rpartition(":")
        hit = (scheme, host.strip("[]"), int(port))
        if len(_SPLIT) > 4096:
            _SPLIT.clear()
        _SPLIT[url] = hit
    return hit


_SPLIT: dict[str, tuple[str, str, int]] = {}


async def open_response(pool: UpstreamPool, targets: list[str], method: str, target: bytes,
                headers: list, body: bytes, streaming: bool) -> UpstreamResponse:
    tries = targets[:1] if streaming else targets[:2]
    for i, base in enumerate(tries):
        scheme, host, port = split_target(base)
        try:
            return await pool.request(scheme, host, port, method, target, headers, body)
        except UpstreamConnectError:
            if i + 1 == len(tries):
                raise UpstreamFailed("could not connect to any ready replica") from None
        except UpstreamTimeoutError:
            raise UpstreamTimeout("the upstream did not answer in time") from None
        except UpstreamError:
            raise UpstreamFailed("the upstream request failed") from None
    raise UpstreamFailed("the endpoint has no upstream to try")


async def forward(pool: UpstreamPool, send, targets: list[str], method: str, target: bytes,
                  headers: list, body: bytes, streaming: bool, extra: list | None = None) -> ProxyResult:
    t0 = time.perf_counter()
    resp = await open_response(pool, targets, method, target, headers, body, streaming)
    return await relay(resp, send, t0, extra)


async def relay(resp: UpstreamResponse, send, t0: float, extra: list | None = None) -> ProxyResult:
    """Send an opened upstream response to the client as it arrives; closes it in any case."""
    try:
        ctype = resp.header(b"content-type") or b""
        sse = ctype.startswith(b"text/event-stream")
        scanner = SseUsageScanner() if sse else None
        keep = bytearray() if not sse and resp.header(b"content-encoding") is None else None
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": client_headers(resp.headers) + (extra or [])})
        ttft = None
        try:
            while True:
                chunk = await resp.next_chunk()
                if chunk is None:
                    break
                if ttft is None:
                    ttft = time.perf_counter() - t0
                if scanner is not None:
                    scanner.feed(chunk)
                elif keep is not None:
                    if len(keep) + len(chunk) <= JSON_KEEP:
                        keep += chunk
                    else:
                        keep = None
                last = resp.at_end  # the whole body is here: one send, no trailing empty message
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    break
        except UpstreamError as exc:
            reason = "upstream idle timeout" if isinstance(exc, UpstreamTimeoutError) else "upstream broke mid-response"
            if not sse:
                raise UpstreamBroke(reason) from None
            event = {"error": {"message": reason, "type": "upstream_error", "code": "upstream_broken"}}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": False})
            return ProxyResult(502, scanner.tokens, False, ttft, reason)
        if chunk is None:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        tokens = scanner.tokens if scanner is not None else None
        if keep and b'"usage"' in keep:
            try:
                tokens = usage_tokens(loads(keep))
            except ValueError:
                tokens = None
        ok = resp.status < 400
        return ProxyResult(resp.status, tokens, ok, ttft, "" if ok else f"upstream status {resp.status}")
    finally:
        resp.close()
