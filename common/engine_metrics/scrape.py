"""The engines' HTTP client (a /metrics page, a /health probe): plain HTTP/1.1 GET through the
shared keep-alive client (common.http1_client, the gateway proxy's), one kept-alive connection per
engine, bounded concurrency (a semaphore), one timeout per request. The agent uses it for the
engines on its host; fabricd for engines no agent observes (its scrape fallback, its reconcile
health probes).

Why not httpx here: one ``httpx.AsyncClient`` scraping N engines holds N origins in one httpcore
pool, and the pool re-scans every connection for every queued request on each request start and
finish (O(N^2) per pass: ~750 ms for 200 engines on loopback, two thirds of the routing tick); a
client per engine avoids that but still spends about 1 ms CPU per request in httpx/httpcore/h11/
anyio (~150 ms per pass). A scrape is one GET of a text page, so this does exactly that (see
docs/orchestration.md, Benchmark).

The shared client handles ``Content-Length``, ``Transfer-Encoding: chunked`` and read-to-close
bodies, ``Connection: close``, interim 1xx answers, IPv6 literals, and a kept-alive connection the
engine closed while idle (one retry on a fresh connection, only when nothing of the answer
arrived). This module adds the scrape policy: a semaphore, one deadline per scrape, a gzip body
(we ask for identity; inflated to at most ``max_bytes``, common.gzip_bounded), and anything that is not a 200 with a body under ``max_bytes`` is a
``ScrapeError`` (the connection is dropped); ``probe`` answers any status (a health probe). Idle connections expire after ``idle_s`` (below
uvicorn's 5 s keep-alive, so a 10 s routing period normally reconnects; back-to-back passes reuse).
"""

from __future__ import annotations

import asyncio

from common.gzip_bounded import GzipInvalid, GzipTooLarge, gunzip_bounded
from common.http1_client import UpstreamError, UpstreamPool, UpstreamTimeoutError

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_CONCURRENCY = 64
DEFAULT_IDLE_S = 4.0
DEFAULT_MAX_BYTES = 8 << 20

_HEADERS = [(b"accept", b"text/plain;version=0.0.4, */*;q=0.1"), (b"accept-encoding", b"identity"),
            (b"user-agent", b"fabric-engine-metrics")]


class ScrapeError(Exception):
    """The GET failed: connect, timeout, not HTTP, not 200, or a body that is too big."""


class MetricsScraper:
    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S, concurrency: int = DEFAULT_CONCURRENCY,
                 idle_s: float = DEFAULT_IDLE_S, max_bytes: int = DEFAULT_MAX_BYTES):
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.idle_s = idle_s
        self.max_bytes = max_bytes
        self._pool: UpstreamPool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sem: asyncio.Semaphore | None = None

    def _bind(self) -> asyncio.Semaphore:
        """Connections and the semaphore belong to one event loop (tests run several)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._sem is None or self._pool is None:
            self._drop_all()
            # The scrape's own deadline bounds everything; the pool's timeouts only back it up.
            self._pool = UpstreamPool(connect_timeout=self.timeout_s, idle_timeout=self.timeout_s,
                                      keepalive_secs=self.idle_s, max_idle_per_host=1)
            self._loop, self._sem = loop, asyncio.Semaphore(self.concurrency)
        return self._sem

    async def get_text(self, host: str, port: int, path: str = "/metrics") -> str:
        """The body of ``GET http://host:port/path`` as text; ScrapeError otherwise."""
        async with self._bind():
            try:
                body = await asyncio.wait_for(self._get(host, port, path), self.timeout_s)
            except (asyncio.TimeoutError, UpstreamTimeoutError):  # asyncio's is not the builtin on 3.10
                raise ScrapeError(f"timed out after {self.timeout_s:g}s") from None
            except UpstreamError as exc:
                raise ScrapeError(str(exc)) from None
        return body.decode("utf-8", errors="replace")

    async def probe(self, host: str, port: int, path: str) -> int:
        """The HTTP status of ``GET http://host:port/path`` (its body read and dropped);
        ScrapeError when no answer came in time."""
        async with self._bind():
            try:
                status, _ = await asyncio.wait_for(self._fetch(host, port, path, any_status=True), self.timeout_s)
            except (asyncio.TimeoutError, UpstreamTimeoutError):
                raise ScrapeError(f"timed out after {self.timeout_s:g}s") from None
            except UpstreamError as exc:
                raise ScrapeError(str(exc)) from None
        return status

    def keep_only(self, origins: set[tuple[str, int]]) -> None:
        """Close idle connections to engines that are no longer scraped."""
        if self._pool is not None:
            self._pool.keep_only({("http", host, port) for host, port in origins})

    async def aclose(self) -> None:
        self._drop_all()

    def _drop_all(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def _get(self, host: str, port: int, path: str) -> bytes:
        return (await self._fetch(host, port, path))[1]

    async def _fetch(self, host: str, port: int, path: str, any_status: bool = False) -> tuple[int, bytes]:
        assert self._pool is not None
        resp = await self._pool.request("http", host, port, "GET", path.encode("latin-1"), _HEADERS, b"")
        try:
            if resp.status != 200 and not any_status:
                raise ScrapeError(f"HTTP {resp.status}")
            length = resp.header(b"content-length")
            if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
                raise ScrapeError(f"body over {self.max_bytes} bytes")
            parts, size = [], 0
            while (chunk := await resp.next_chunk()) is not None:
                size += len(chunk)
                if size > self.max_bytes:
                    raise ScrapeError(f"body over {self.max_bytes} bytes")
                parts.append(chunk)
            body = parts[0] if len(parts) == 1 else b"".join(parts)
            if (resp.header(b"content-encoding") or b"identity").strip().lower() == b"gzip":
                try:
                    body = gunzip_bounded(body, self.max_bytes)  # a page that inflates past max_bytes is refused
                except GzipTooLarge as exc:
                    raise ScrapeError(f"body {exc}") from None
                except GzipInvalid as exc:
                    raise ScrapeError(f"bad gzip body: {exc}") from None
            return resp.status, body
        finally:
            resp.close()  # a fully read keep-alive answer goes back to the pool; anything else is aborted
