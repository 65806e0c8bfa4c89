"""The HTTP proxy hot path: common.http1_client's keep-alive pool, streamed both ways, never
buffered.

forward() sends the call to the first target; a connect failure moves to the next target once,
only for a non-streaming call (no byte can have arrived when the connection never opened).
When the caller names the replica behind each target (``names``), the answer carries
``x-fabric-replica: <replica id>`` for the target that answered, unless the upstream set one
itself (the engine simulator does); a VIP target has no name here (its Maglev picks the replica).
The upstream body is relayed chunk by chunk as it arrives (SSE included; chunks already waiting
are sent together); the upstream response is always closed in a finally, so cancelling the task
(the client left, the deadline passed) closes the upstream connection at once. The pool's idle
timeout covers the wait for the response head and every gap between chunks.

A cut upstream is never a clean end. When the upstream dies after an SSE response has started,
or ends the stream without vLLM's closing ``data: [DONE]`` (an engine stopped mid-answer can
close its chunked body cleanly), the client gets a final OpenAI-shaped ``data: {"error": ...}``
event and no ``[DONE]`` (the openai client raises on it); the call is FAILED in the audit and
counted as outcome ``upstream_cut`` (fabric_gateway_requests). A non-SSE answer is held until
it is complete (up to JSON_KEEP, 1 MiB: an OpenAI JSON answer is one piece), so an upstream
that breaks before then gives the client a 502 with an error body; a larger body already under
way is truncated (the connection is aborted), so a partial answer is never taken as complete.
A Responses API stream ends with its final response event instead of ``[DONE]``. A chat or text
completion stream may instead go on at another replica (gateway.stream_migration): the cut path
above is then taken only when it may not or cannot move.

With a live budget (gateway.live_budget) a stream is relayed event by event and may end at the
call's token limits: an error event then ``data: [DONE]`` (outcome budget_cut).
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
# x-request-id: the gateway's own replaces the caller's (an engine reads the first one it sees).
NOT_FORWARDED = HOP_BY_HOP | {b"authorization", b"api-key", b"x-api-key", b"host", b"content-length", b"expect",
                               b"x-request-id"}
JSON_KEEP = 1024 * 1024  # non-streamed bodies up to this size are parsed for usage
REPLICA_HEADER = b"x-fabric-replica"  # which replica answered (its id: nothing secret)


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
    cut: bool = False  # the upstream failed after the answer started (outcome upstream_cut)
    cut_by: str = ""  # the limit that ended the stream mid-way (gateway.live_budget; outcome budget_cut)
    migrated: int = 0  # times the stream went on at another replica (gateway.stream_migration)


def upstream_headers(raw: list[tuple[bytes, bytes]], request_id: bytes) -> list[tuple[bytes, bytes]]:
    # ASGI servers hand header names over lowercased already.
    out = [(k, v) for k, v in raw if k not in NOT_FORWARDED]
    out.append((b"x-request-id", request_id))
    return out


def client_headers(raw: list[tuple[bytes, bytes]], allow: frozenset[bytes] | None = None) -> list[tuple[bytes, bytes]]:
    # The upstream client lowercases header names.
    if allow is not None:
        return [(k, v) for k, v in raw if k in allow]
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


class VipConnections:
    """Retire the kept-alive connections to an endpoint's VIP when one of its replicas leaves
    the routable set (a drain, a failure): a kept-alive connection is an established flow, which
    Maglev keeps on its backend, so the gateway's new calls would keep reaching the draining
    replica over it (and be cut when its grace ends). New connections are new flows, picked
    among the remaining backends."""

    MAX = 4096

    def __init__(self) -> None:
        self._seen: dict[str, tuple[object, frozenset[str]]] = {}  # endpoint -> (replicas tuple, their ids)

    def note(self, pool: UpstreamPool, endpoint: str, vip_url: str, replicas: tuple) -> None:
        """``replicas``: the view's routable replicas (the cached view's own tuple, so a call with
        an unchanged view costs one identity check)."""
        last = self._seen.get(endpoint)
        if last is not None and last[0] is replicas:
            return
        ids = frozenset(r.replica_id for r in replicas)
        if len(self._seen) >= self.MAX:
            self._seen.clear()
        self._seen[endpoint] = (replicas, ids)
        if last is not None and last[1] - ids:
            pool.retire(*split_target(vip_url))


async def open_response(pool: UpstreamPool, targets: list[str], method: str, target: bytes,
                headers: list, body: bytes, streaming: bool) -> UpstreamResponse:
    return (await _open(pool, targets, method, target, headers, body, streaming))[0]


async def _open(pool: UpstreamPool, targets: list[str], method: str, target: bytes,
                headers: list, body: bytes, streaming: bool) -> tuple[UpstreamResponse, str]:
    """The opened response and the target that answered."""
    tries = targets[:1] if streaming else targets[:2]
    for i, base in enumerate(tries):
        scheme, host, port = split_target(base)
        try:
            return await pool.request(scheme, host, port, method, target, headers, body), base
        except UpstreamError as exc:
            if not isinstance(exc, UpstreamConnectError) or i + 1 == len(tries):
                raise _failure(exc) from None
    raise UpstreamFailed("the endpoint has no upstream to try")


def _failure(exc: UpstreamError) -> FabricError:
    """The client's error for an upstream that failed before its response head."""
    if isinstance(exc, UpstreamConnectError):
        return UpstreamFailed("could not connect to any ready replica")
    if isinstance(exc, UpstreamTimeoutError):
        return UpstreamTimeout("the upstream did not answer in time")
    return UpstreamFailed("the upstream request failed")


async def forward(pool: UpstreamPool, send, targets: list[str], method: str, target: bytes,
                  headers: list, body: bytes, streaming: bool, extra: list | None = None,
                  strip=None, names: dict[str, str] | None = None, budget=None, migration=None) -> ProxyResult:
    """``strip``: a gateway.usage_inject.UsageStripper when the gateway asked for the usage the
    client did not: its usage event is counted, never relayed. ``names``: target URL -> replica
    id, for the x-fabric-replica header. ``budget``: a gateway.live_budget.LiveBudget that may
    end the stream at the call's token limits. ``migration``: a gateway.stream_migration.Migration
    when the call may go on at another replica: one that fails before its response head is
    re-issued whole, a cut SSE answer continues (charged what the engines computed)."""
    t0 = time.perf_counter()
    failed, cut_at = [], None
    if migration is None or not targets:
        resp, base = await _open(pool, targets, method, target, headers, body, streaming)
        replica = names.get(base) if names else None
    else:
        try:
            resp, replica, failed, cut_at = await migration.open(targets[0], (names or {}).get(targets[0]))
        except UpstreamError as exc:
            raise _failure(exc) from None
    if replica and resp.header(REPLICA_HEADER) is None:
        extra = [*(extra or []), (REPLICA_HEADER, replica.encode())]
    if migration is None or not (resp.header(b"content-type") or b"").startswith(b"text/event-stream") \
            or resp.status != 200:
        return await relay(resp, send, t0, extra, strip=strip, budget=budget)
    moving = migration.wrap(resp, replica, failed, cut_at)
    result = await relay(moving, send, t0, extra, strip=strip, budget=budget)
    result.tokens = moving.charged(result.tokens)
    result.migrated = len(moving.hops) - 1
    return result


DONE = b"[DONE]"  # vLLM and OpenAI end a chat or completions stream with "data: [DONE]"
# A Responses API stream (OpenAI's, vLLM's) has no [DONE]: it ends with one of these events, named
# on its event line or in its data's type (never matched inside a chat token: JSON escapes the
# quotes and the newline around them).
RESPONSE_ENDS = tuple(f.format(kind).encode() for kind in ("completed", "incomplete", "failed")
                      for f in ("event: response.{}", '"type":"response.{}"'))
DONE_TAIL = 64  # bytes of the stream's end kept to look for DONE


def error_event(reason: str, tail: bytes = b"\n\n") -> bytes:
    """The final event of a cut stream; a partial event already relayed is ended first, so the
    error is an event of its own."""
    event = {"error": {"message": reason, "type": "upstream_error", "code": "upstream_broken"}}
    sep = b"" if tail.endswith(b"\n\n") or not tail else b"\n\n"
    return sep + b"data: " + json.dumps(event).encode() + b"\n\n"


def _cut_tokens(scanner: SseUsageScanner, budget) -> int | None:
    """A cut stream's charge: its usage if one went by, else what a live budget saw relayed."""
    return scanner.tokens if scanner.tokens is not None or budget is None else budget.used


def _result(status: int, tokens: int | None, ttft: float | None) -> ProxyResult:
    ok = status < 400
    return ProxyResult(status, tokens, ok, ttft, "" if ok else f"upstream status {status}")


async def _relay_body(resp: UpstreamResponse, send, head: dict, t0: float) -> ProxyResult:
    """A non-SSE answer: held until complete (or past JSON_KEEP), so a break before then is a
    502 with an error body instead of a truncated 200."""
    held = bytearray()
    ttft = None
    try:
        while True:
            chunk = await resp.next_chunk()
            if chunk is not None:
                ttft = time.perf_counter() - t0 if ttft is None else ttft
                held += chunk
            if chunk is None or resp.at_end:
                await send(head)
                await send({"type": "http.response.body", "body": bytes(held), "more_body": False})
                tokens = None
                if b'"usage"' in held and resp.header(b"content-encoding") is None:
                    try:
                        tokens = usage_tokens(loads(held))
                    except ValueError:
                        tokens = None
                return _result(resp.status, tokens, ttft)
            if len(held) > JSON_KEEP:
                break
    except UpstreamTimeoutError:
        raise UpstreamTimeout("the upstream went quiet before its answer was complete") from None
    except UpstreamError:
        raise UpstreamFailed("the upstream broke before its answer was complete") from None
    await send(head)  # a large body: relayed as it comes; a break now can only truncate it
    await send({"type": "http.response.body", "body": bytes(held), "more_body": True})
    try:
        while True:
            chunk = await resp.next_chunk()
            if chunk is None:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                break
            last = resp.at_end
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            if last:
                break
    except UpstreamError as exc:
        reason = "upstream idle timeout" if isinstance(exc, UpstreamTimeoutError) else "upstream broke mid-response"
        raise UpstreamBroke(reason) from None
    return _result(resp.status, None, ttft)


async def relay(resp: UpstreamResponse, send, t0: float, extra: list | None = None,
                expect_done: bool = True, strip=None, budget=None,
                allow: frozenset[bytes] | None = None) -> ProxyResult:
    """Send an opened upstream response to the client as it arrives; closes it in any case.
    ``expect_done``: an SSE answer that ends without ``data: [DONE]`` (or, for the Responses
    API, its final response event) was cut (OpenAI-style streams, vLLM's included, always end
    with it). ``allow``: only these response headers reach the client (an external provider's),
    else all but the hop-by-hop ones."""
    try:
        ctype = resp.header(b"content-type") or b""
        head = {"type": "http.response.start", "status": resp.status,
                "headers": client_headers(resp.headers, allow) + (extra or [])}
        if not ctype.startswith(b"text/event-stream"):
            return await _relay_body(resp, send, head, t0)
        scanner = SseUsageScanner()
        await send(head)
        ttft = None
        tail = b""
        ended = False  # a Responses API final event went by
        try:
            while True:
                chunk = await resp.next_chunk()
                if chunk is None:
                    break
                if ttft is None:
                    ttft = time.perf_counter() - t0
                scanner.feed(chunk)
                tail = (tail + chunk[-DONE_TAIL:])[-DONE_TAIL:]
                if b"response." in chunk and any(m in chunk for m in RESPONSE_ENDS):
                    ended = True
                last = resp.at_end  # the whole body is here: one send, no trailing empty message
                if budget is not None:
                    chunk, n = budget.feed(chunk)
                    if n and not budget.fits(n):
                        chunk, going = await budget.take_events(chunk, n)
                        if not going:  # spent: what fits, then the error event and [DONE]
                            if strip is not None:
                                chunk = strip.feed(chunk)
                            await send({"type": "http.response.body", "body": chunk + budget.cut_event(),
                                        "more_body": False})
                            return ProxyResult(resp.status, budget.used, False, ttft, f"{budget.cut_by} reached",
                                               cut_by=budget.cut_by)
                    if last:
                        chunk += budget.flush()
                if strip is not None:
                    chunk = strip.feed(chunk) + (strip.flush() if last else b"")
                if last and expect_done and DONE not in tail and not ended:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    break  # ended without [DONE]: the error event follows
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return _result(resp.status, scanner.tokens, ttft)
        except UpstreamError as exc:
            reason = "upstream idle timeout" if isinstance(exc, UpstreamTimeoutError) else "upstream broke mid-response"
            held = strip.flush() if strip is not None else b""
            await send({"type": "http.response.body", "body": held + error_event(reason, tail), "more_body": False})
            return ProxyResult(502, _cut_tokens(scanner, budget), False, ttft, reason, cut=True)
        if expect_done and DONE not in tail and not ended:
            reason = "the upstream ended the stream before its final event"
            held = strip.flush() if strip is not None else b""
            await send({"type": "http.response.body", "body": held + error_event(reason, tail), "more_body": False})
            return ProxyResult(502, _cut_tokens(scanner, budget), False, ttft, reason, cut=True)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return _result(resp.status, scanner.tokens, ttft)
    finally:
        resp.close()
