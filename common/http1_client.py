"""A small purpose-built asyncio HTTP/1.1 client, shared by the gateway's proxy hot path
(gateway/proxy.py) and the routing controller's /metrics scraper (common/engine_metrics/scrape.py).

Why not httpx here: per proxied call httpx/httpcore cost more CPU than the rest of the gateway
(request/URL/header objects, an anyio stream layer, and a pool that polls every idle socket),
and one httpx pool over N scraped engines re-scans every connection for every queued request
(O(N^2) per routing pass). This client does only what those two callers need:

- one keep-alive pool per (scheme, host, port), LIFO, idle sockets dropped after
  ``keepalive_secs`` or as soon as the upstream closes them (``connection_lost``), and
  ``keep_only`` drops those of origins no longer used;
- the request is written in one ``transport.write`` (head and body together, so Nagle has
  nothing to hold back; TCP_NODELAY is set anyway);
- the response is parsed by ``httptools`` (llhttp): Content-Length, chunked transfer decoding
  and read-until-close bodies; 1xx interim responses are skipped;
- the body is handed out chunk by chunk as it arrives (SSE is never held back); a slow reader
  pauses the socket above ``HIGH_WATER`` buffered bytes;
- a connect timeout, and an idle timeout for every wait on the upstream (the response head
  and each gap between chunks), one timer per connection; the total deadline is the caller's
  (the gateway's gateway.deadlines);
- a response that is not read to its end (the client left, a timeout, a cancel) closes its
  connection at once, so the upstream sees the disconnect; only a fully read response whose
  upstream allows keep-alive goes back to the pool;
- TLS with an ``ssl.SSLContext`` (FABRIC_BACKEND_TLS, mTLS) through asyncio's own TLS.

A reused keep-alive connection that the upstream had already closed (the classic keep-alive
race: it closed just as we wrote) fails with no response byte; that case is retried once on a
fresh connection only for an idempotent method (GET, HEAD, OPTIONS, PUT, DELETE): a POST may
have been acted on (a generation started, a batch created), so it is never replayed -- it fails
with UpstreamClosedError, as Go's net/http does. Everything else is the caller's policy.

Guards against an upstream that misbehaves (it cannot desynchronise the pool or hold a caller):
- the response head is limited to MAX_HEADERS header lines and MAX_HEAD_BYTES bytes, and must
  arrive whole within the idle timeout (not per byte: a trickle cannot stretch it);
- a byte that arrives on an idle pooled socket (nothing was asked) poisons it: the socket is
  closed and never handed to the next caller, so a stray "response" cannot answer its request;
- a connect timeout is an UpstreamConnectError (nothing was sent), so callers retry it like a
  refused connection.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from collections.abc import Container

import httptools

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024
MAX_HEADERS = 100
MAX_HEAD_BYTES = 64 * 1024
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


class UpstreamError(Exception):
    """Any failure talking to the upstream."""


class UpstreamConnectError(UpstreamError):
    """The TCP (or TLS) connection could not be opened: no byte was sent."""


class UpstreamTimeoutError(UpstreamError):
    """Connect timeout, or the upstream was silent longer than the idle timeout."""


class UpstreamConnectTimeout(UpstreamConnectError, UpstreamTimeoutError):
    """The connection did not open in time: nothing was sent, so it may be tried elsewhere."""


class UpstreamClosedError(UpstreamError):
    """The upstream closed the connection or sent something that is not HTTP/1.1."""


class _Stale(UpstreamClosedError):
    """A reused connection died before any response byte: safe to retry on a fresh one."""


class _Conn(asyncio.Protocol):
    """One upstream connection and the response being read on it (one at a time)."""

    __slots__ = (
        "buffered",
        "chunks",
        "closed",
        "complete",
        "epoch",
        "error",
        "got_bytes",
        "head_bytes",
        "head_only",
        "headers",
        "headers_done",
        "idle_since",
        "in_use",
        "interim",
        "keep_alive",
        "key",
        "length_known",
        "loop",
        "parser",
        "paused",
        "pool",
        "reused",
        "status",
        "timer",
        "transport",
        "wait_until",
        "waiter",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: UpstreamPool, key: tuple):
        self.loop = loop
        self.pool = pool
        self.key = key
        self.epoch = pool._epochs.get(key, 0)  # UpstreamPool.retire: an older one is never reused
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made, before any use
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self.in_use = True
        self.timer: asyncio.TimerHandle | None = None  # the idle timeout's, one per connection
        self.wait_until = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.headers_done = False
        self.complete = False
        self.interim = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future | None = None
        self.error: Exception | None = None
        self.got_bytes = False
        self.length_known = False
        self.head_only = False
        self.keep_alive = False

    # --- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        if not self.in_use:
            # Nothing was asked on this idle pooled socket: whatever this is, it must never be
            # read as the answer to the next request. Poison the socket.
            self.closed = True
            self.transport.abort()
            return
        self.got_bytes = True
        if not self.headers_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # An exception in a parser callback (the header count) arrives as its __context__.
            cause = exc.__context__ if isinstance(exc.__context__, _HeadTooLarge) else None
            self._fail(UpstreamClosedError(str(cause) if cause else f"malformed upstream response: {exc}"))
            self.closed = True
            self.transport.abort()
        else:
            if not self.headers_done and self.head_bytes > MAX_HEAD_BYTES:
                self._fail(UpstreamClosedError(f"the upstream response head is over {MAX_HEAD_BYTES} bytes"))
                self.closed = True
                self.transport.abort()
        self._wake()

    def eof_received(self):
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.headers_done and not self.complete and not self.length_known and not self.head_only:
            self.complete = True  # a body delimited by the end of the connection
        elif not self.complete and self.error is None:
            if self.reused and not self.got_bytes:
                self.error = _Stale("the kept-alive upstream connection was closed")
            else:
                self.error = UpstreamClosedError("the upstream closed the connection")
        self._wake()

    def pause_writing(self) -> None:  # the request is written in one go; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks -------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_HEADERS:
            raise _HeadTooLarge(f"the upstream response head has more than {MAX_HEADERS} headers")
        name = name.lower()
        if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
            self.length_known = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue, 103 Early Hints): skip it
            self.interim = True
            self.headers = []
            self.length_known = False
            return
        self.status = status
        self.headers_done = True
        if self.head_only:  # llhttp cannot know a HEAD answer has no body; never reused
            self.length_known = True
            self.complete = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.keep_alive = self.parser.should_keep_alive()  # llhttp forgets it once the message ends
        self.complete = True

    # --- used by UpstreamResponse ----------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self, idle: float) -> None:
        """Until something arrives or the connection ends; UpstreamTimeoutError after idle
        seconds. One timer per connection, moved only when it fires before the wait's end (a
        timer scheduled and cancelled per wait cost ~2 us of the gateway's hot path)."""
        loop = self.loop
        fut = loop.create_future()
        self.waiter = fut
        self.wait_until = until = loop.time() + idle
        timer = self.timer
        if timer is None or timer.when() > until:
            if timer is not None:
                timer.cancel()
            self.timer = loop.call_at(until, self._on_timer)
        try:
            await fut
        finally:
            self.waiter = None

    def _on_timer(self) -> None:
        self.timer = None
        fut = self.waiter
        if fut is None or fut.done():
            return  # nobody waits: re-armed by the next wait
        if self.loop.time() + 0.001 >= self.wait_until:  # the loop's clock ticks in milliseconds
            fut.set_exception(UpstreamTimeoutError("the upstream sent nothing within the idle timeout"))
        else:
            self.timer = self.loop.call_at(self.wait_until, self._on_timer)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _HeadTooLarge(Exception):
    pass


class UpstreamResponse:
    """The response head, and the body read with ``next_chunk()`` until it returns None.
    ``close()`` is required (in a finally): it pools the connection or aborts it."""

    __slots__ = ("_conn", "_done", "_idle", "headers", "status")

    def __init__(self, conn: _Conn, idle: float):
        self._conn = conn
        self._idle = idle
        self.status = conn.status
        self.headers = conn.headers
        self._done = False

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    @property
    def at_end(self) -> bool:
        """True when everything the upstream will send is already buffered."""
        c = self._conn
        return c.complete and not c.chunks

    async def next_chunk(self) -> bytes | None:
        """The body bytes that have arrived (joined when several are waiting), or None at its end."""
        c = self._conn
        while True:
            if c.chunks:
                data = c.chunks.popleft() if len(c.chunks) == 1 else b"".join(_drain(c.chunks))
                c.buffered -= len(data)
                if c.paused and c.buffered < LOW_WATER and not c.closed:
                    c.paused = False
                    c.transport.resume_reading()
                return data
            if c.complete:
                self._done = True
                return None
            if c.error is not None:
                raise c.error
            await c.wait(self._idle)

    def close(self) -> None:
        c = self._conn
        if c is None:
            return
        self._conn = None  # type: ignore[assignment]  # closed; no reads follow close()
        if (self._done or (c.complete and not c.chunks)) and not c.closed and not c.paused \
                and not c.head_only and c.keep_alive:
            c.pool._put(c)
        else:
            c.abort()


def _drain(chunks: deque) -> list[bytes]:
    out = list(chunks)
    chunks.clear()
    return out


class UpstreamPool:
    """Keep-alive connections per (scheme, host, port). One per event loop (the gateway
    process's, the routing scraper's)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, *, connect_timeout: float = 5.0,
                 idle_timeout: float = 60.0, keepalive_secs: float = 4.0, max_idle_per_host: int = 256):
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.keepalive_secs = keepalive_secs
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple, list[_Conn]] = {}
        self._epochs: dict[tuple, int] = {}  # (scheme, host, port) -> retire count
        self.opened = 0  # connections opened so far (tests, diagnostics)

    def _put(self, conn: _Conn) -> None:
        if conn.epoch != self._epochs.get(conn.key, 0):  # retired while it was in use
            conn.abort()
            return
        conn._reset()
        conn.in_use = False
        conn.reused = True
        conn.idle_since = time.monotonic()
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle_per_host:
            conn.abort()
        else:
            idle.append(conn)

    def _take(self, key: tuple) -> _Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_ok = time.monotonic() - self.keepalive_secs
        while idle:
            conn = idle.pop()
            # transport.is_closing(): the peer closed it and connection_lost is still queued (a
            # write now raises RuntimeError on uvloop); nothing was sent on it, so it is skipped
            if not conn.closed and not conn.transport.is_closing() and conn.idle_since >= oldest_ok:
                conn.in_use = True
                return conn
            conn.abort()
        return None

    async def _connect(self, scheme: str, host: str, port: int) -> _Conn:
        loop = asyncio.get_running_loop()
        key = (scheme, host, port)
        tls = self.ssl_context if scheme == "https" else None
        if scheme == "https" and tls is None:
            tls = ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Conn(loop, self, key), host, port, ssl=tls,
                server_hostname=host if tls is not None else None), self.connect_timeout)
        except asyncio.TimeoutError:  # asyncio's, not the builtin, on Python 3.10
            raise UpstreamConnectTimeout(f"connect to {host}:{port} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise UpstreamConnectError(f"connect to {host}:{port} failed: {exc}") from None
        self.opened += 1
        return conn

    async def request(self, scheme: str, host: str, port: int, method: str, target: bytes,
                      headers: list[tuple[bytes, bytes]], body: bytes) -> UpstreamResponse:
        """Send one request and return once the response head has arrived. ``target`` is the
        raw request-target (path and query); ``headers`` must not hold host/content-length."""
        key = (scheme, host, port)
        hostport = (f"[{host}]" if ":" in host else host).encode() + b":" + str(port).encode()
        parts = [method.encode(), b" ", target, b" HTTP/1.1\r\nhost: ", hostport, b"\r\n"]
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            parts += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
        for k, v in headers:
            parts += [k, b": ", v, b"\r\n"]
        parts.append(b"\r\n")
        if body:
            parts.append(body)
        data = b"".join(parts)
        for attempt in (0, 1):
            conn = self._take(key) if attempt == 0 else None
            if conn is None:
                conn = await self._connect(scheme, host, port)
            conn.head_only = method == "HEAD"
            try:
                if conn.transport.is_closing():  # closed by the peer as it opened: nothing sent
                    raise UpstreamClosedError("the upstream closed the connection before the request was sent")
                conn.transport.write(data)
                # The whole head within the idle timeout: a trickle of bytes cannot stretch it.
                head_deadline = conn.loop.time() + self.idle_timeout
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    left = head_deadline - conn.loop.time()
                    if left <= 0:
                        raise UpstreamTimeoutError("the upstream did not send a whole response head in time")
                    await conn.wait(left)
            except _Stale:
                conn.abort()
                if attempt == 0 and method in IDEMPOTENT:
                    continue
                raise UpstreamClosedError("the upstream closed the connection before answering") from None
            except BaseException:
                conn.abort()
                raise
            return UpstreamResponse(conn, self.idle_timeout)
        raise AssertionError("unreachable")

    def retire(self, scheme: str, host: str, port: int) -> None:
        """No connection to (scheme, host, port) opened before now is used again: the idle ones
        close at once, the ones in use when their response ends. For a VIP: a kept-alive
        connection is one established flow, which stays on its backend through a drain, so new
        requests must open new connections (new flows) to reach the remaining backends."""
        key = (scheme, host, port)
        self._epochs[key] = self._epochs.get(key, 0) + 1
        for conn in self._idle.pop(key, []):
            conn.abort()

    def keep_only(self, keys: Container[tuple[str, str, int]]) -> None:
        """Close the idle connections of every (scheme, host, port) not in ``keys``."""
        for key in [k for k in self._idle if k not in keys]:
            for conn in self._idle.pop(key):
                conn.abort()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                try:
                    conn.abort()
                except RuntimeError:  # its event loop is already closed
                    pass
        self._idle.clear()
