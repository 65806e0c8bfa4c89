"""The HTTP proxy hot path: one pooled httpx.AsyncClient, streamed both ways, never buffered.

forward() sends the call to the first target; a connect failure moves to the next target once,
only for a non-streaming call (no byte can have arrived when the connection never opened).
The upstream body is relayed chunk by chunk with aiter_raw (SSE included); the upstream response
is always closed in a finally, so cancelling the task (the client left, the deadline passed)
closes the upstream connection at once. httpx's read timeout is the idle gap between chunks.

When the upstream dies after the response has started, an SSE client gets a final
``data: {"error": ...}`` event (the openai client raises on it); any other client gets a
truncated body (the connection is aborted), so a partial answer is never taken as complete.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from common.errors import FabricError
from gateway.request_body import SseUsageScanner, usage_tokens

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"trailers", b"transfer-encoding", b"upgrade",
})
# Never sent upstream: the caller's credential stays at the gateway; httpx sets host/length.
NOT_FORWARDED = HOP_BY_HOP | {b"authorization", b"api-key", b"x-api-key", b"host", b"content-length"}
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


def upstream_headers(raw: list[tuple[bytes, bytes]], request_id: str) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in raw if k.lower() not in NOT_FORWARDED]
    out.append((b"x-request-id", request_id.encode()))
    return out


def client_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in HOP_BY_HOP]


async def _open(client: httpx.AsyncClient, targets: list[str], method: str, path: str,
                headers: list, body: bytes, streaming: bool) -> httpx.Response:
    tries = targets[:1] if streaming else targets[:2]
    for i, base in enumerate(tries):
        request = client.build_request(method, base + path, headers=headers, content=body)
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError:
            if i + 1 == len(tries):
                raise UpstreamFailed("could not connect to any ready replica") from None
        except httpx.TimeoutException:
            raise UpstreamTimeout("the upstream did not answer in time") from None
        except httpx.HTTPError:
            raise UpstreamFailed("the upstream request failed") from None
    raise UpstreamFailed("the endpoint has no upstream to try")


async def forward(client: httpx.AsyncClient, send, targets: list[str], method: str, path: str,
                  headers: list, body: bytes, streaming: bool) -> ProxyResult:
    t0 = time.perf_counter()
    resp = await _open(client, targets, method, path, headers, body, streaming)
    try:
        sse = resp.headers.get("content-type", "").startswith("text/event-stream")
        scanner = SseUsageScanner() if sse else None
        keep = bytearray() if not sse and "content-encoding" not in resp.headers else None
        await send({"type": "http.response.start", "status": resp.status_code,
                    "headers": client_headers(resp.headers.raw)})
        ttft = None
        try:
            async for chunk in resp.aiter_raw():
                if ttft is None:
                    ttft = time.perf_counter() - t0
                if scanner is not None:
                    scanner.feed(chunk)
                elif keep is not None:
                    if len(keep) + len(chunk) <= JSON_KEEP:
                        keep += chunk
                    else:
                        keep = None
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (httpx.HTTPError, TimeoutError) as exc:
            reason = "upstream idle timeout" if isinstance(exc, httpx.TimeoutException) else "upstream broke mid-response"
            if not sse:
                raise UpstreamBroke(reason) from None
            event = {"error": {"message": reason, "type": "upstream_error", "code": "upstream_broken"}}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": False})
            return ProxyResult(502, scanner.tokens, False, ttft, reason)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        tokens = scanner.tokens if scanner is not None else None
        if keep:
            try:
                tokens = usage_tokens(json.loads(keep))
            except ValueError:
                tokens = None
        ok = resp.status_code < 400
        return ProxyResult(resp.status_code, tokens, ok, ttft, "" if ok else f"upstream status {resp.status_code}")
    finally:
        await resp.aclose()
