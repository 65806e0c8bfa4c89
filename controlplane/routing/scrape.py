"""The routing controller's /metrics client: plain HTTP/1.1 GET on asyncio streams, one kept-alive
connection per engine, bounded concurrency, one timeout per scrape.

Why not httpx here: one ``httpx.AsyncClient`` scraping N engines holds N origins in one httpcore
pool, and the pool re-scans every connection for every queued request on each request start and
finish (O(N^2) per pass: ~750 ms for 200 engines on loopback, two thirds of the routing tick); a
client per engine avoids that but still spends about 1 ms CPU per request in httpx/httpcore/h11/
anyio (~150 ms per pass). A scrape is one GET of a text page, so this does exactly that: ~12 ms per
pass of 200 (see docs/orchestration.md, Benchmark).

What it handles: ``Content-Length``, ``Transfer-Encoding: chunked`` and read-to-close bodies,
``Connection: close``, interim 1xx answers, a gzip body (we ask for identity), IPv6 literals, and
a kept-alive connection the engine closed while idle (one retry on a fresh connection, only when
nothing of the answer arrived). Anything that is not a 200 with a body under ``max_bytes`` is a
``ScrapeError`` and the connection is dropped. Idle connections expire after ``idle_s`` (below
uvicorn's 5 s keep-alive, so a 10 s routing period normally reconnects; back-to-back passes reuse).
"""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_CONCURRENCY = 64
DEFAULT_IDLE_S = 4.0
DEFAULT_MAX_BYTES = 8 << 20


class ScrapeError(Exception):
    """The GET failed: connect, timeout, not HTTP, not 200, or a body that is too big."""


class _Stale(Exception):
    """A reused connection was closed by the engine before any byte of the answer came back."""


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer, self.idle_since = reader, writer, 0.0

    def abort(self) -> None:
        transport = self.writer.transport
        if transport is not None and not transport.is_closing():
            transport.abort()


class MetricsScraper:
    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S, concurrency: int = DEFAULT_CONCURRENCY,
                 idle_s: float = DEFAULT_IDLE_S, max_bytes: int = DEFAULT_MAX_BYTES):
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.idle_s = idle_s
        self.max_bytes = max_bytes
        self._idle: dict[tuple[str, int], _Conn] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None

    def _bind(self) -> asyncio.Semaphore:
        """Connections and the semaphore belong to one event loop (tests run several)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._sem is None:
            self._drop_all()
            self._loop, self._sem = loop, asyncio.Semaphore(self.concurrency)
        return self._sem

    async def get_text(self, host: str, port: int, path: str = "/metrics") -> str:
        """The body of ``GET http://host:port/path`` as text; ScrapeError otherwise."""
        async with self._bind():
            try:
                async with asyncio.timeout(self.timeout_s):
                    body = await self._get(host, port, path)
            except TimeoutError:
                raise ScrapeError(f"timed out after {self.timeout_s:g}s") from None
        return body.decode("utf-8", errors="replace")

    def keep_only(self, origins: set[tuple[str, int]]) -> None:
        """Close idle connections to engines that are no longer scraped."""
        for key in [k for k in self._idle if k not in origins]:
            self._idle.pop(key).abort()

    async def aclose(self) -> None:
        self._drop_all()

    def _drop_all(self) -> None:
        for conn in self._idle.values():
            try:
                conn.abort()
            except RuntimeError:  # its loop is already closed
                pass
        self._idle.clear()

    # -- one request -------------------------------------------------------------------------------

    async def _get(self, host: str, port: int, path: str) -> bytes:
        key = (host, port)
        conn = self._idle.pop(key, None)
        if conn is not None and (time.monotonic() - conn.idle_since > self.idle_s or conn.reader.at_eof()):
            conn.abort()
            conn = None
        if conn is not None:
            try:
                return await self._exchange(conn, key, path, reused=True)
            except _Stale:
                pass  # the engine closed it while idle: one try on a fresh connection
        try:
            reader, writer = await asyncio.open_connection(host, port, limit=1 << 16)
        except OSError as exc:
            raise ScrapeError(f"connect to {host}:{port} failed: {exc}") from None
        return await self._exchange(_Conn(reader, writer), key, path, reused=False)

    async def _exchange(self, conn: _Conn, key: tuple[str, int], path: str, *, reused: bool) -> bytes:
        host, port = key
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request = (f"GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/plain;version=0.0.4, */*;q=0.1\r\n"
                   "Accept-Encoding: identity\r\nUser-Agent: fabricd-routing\r\n\r\n").encode("latin-1")
        keep = False
        try:
            try:
                conn.writer.write(request)
                await conn.writer.drain()
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if reused and not exc.partial:
                    raise _Stale from None
                raise ScrapeError("connection closed before the response headers") from None
            except (ConnectionResetError, BrokenPipeError) as exc:
                if reused:
                    raise _Stale from None
                raise ScrapeError(f"connection reset: {exc}") from None
            version, code, headers = _parse_head(head)
            while 100 <= code < 200:  # interim answers (100 Continue, 103 Early Hints)
                version, code, headers = _parse_head(await conn.reader.readuntil(b"\r\n\r\n"))
            if code != 200:
                raise ScrapeError(f"HTTP {code}")
            body, delimited = await self._body(conn.reader, headers)
            if headers.get(b"content-encoding", b"identity").lower() == b"gzip":
                try:
                    body = gzip.decompress(body)
                except (OSError, EOFError, zlib.error) as exc:
                    raise ScrapeError(f"bad gzip body: {exc}") from None
            connection = headers.get(b"connection", b"").lower()
            keep = delimited and (b"close" not in connection if version == b"HTTP/1.1" else b"keep-alive" in connection)
            return body
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, ValueError, EOFError) as exc:
            raise ScrapeError(f"bad response: {type(exc).__name__}: {exc}") from None
        finally:
            if keep and key not in self._idle:
                conn.idle_since = time.monotonic()
                self._idle[key] = conn
            else:
                conn.abort()

    async def _body(self, reader: asyncio.StreamReader, headers: dict[bytes, bytes]) -> tuple[bytes, bool]:
        """(body, length-delimited): a read-to-close body leaves the connection unusable."""
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            parts, size_total = [], 0
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                        pass
                    return b"".join(parts), True
                size_total += size
                if size_total > self.max_bytes:
                    raise ScrapeError(f"body over {self.max_bytes} bytes")
                parts.append(await reader.readexactly(size))
                if await reader.readexactly(2) != b"\r\n":
                    raise ValueError("chunk without CRLF")
        length = headers.get(b"content-length")
        if length is not None:
            n = int(length)
            if n > self.max_bytes:
                raise ScrapeError(f"body over {self.max_bytes} bytes")
            return await reader.readexactly(n), True
        parts, size_total = [], 0
        while chunk := await reader.read(1 << 16):
            size_total += len(chunk)
            if size_total > self.max_bytes:
                raise ScrapeError(f"body over {self.max_bytes} bytes")
            parts.append(chunk)
        return b"".join(parts), False


def _parse_head(head: bytes) -> tuple[bytes, int, dict[bytes, bytes]]:
    lines = head.split(b"\r\n")
    status = lines[0].split(None, 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
        raise ScrapeError(f"not an HTTP response: {lines[0][:60]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
    return status[0], int(status[1]), headers
