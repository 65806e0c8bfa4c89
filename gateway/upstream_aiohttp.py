"""aiohttp's client behind the same interface as common.http1_client.UpstreamPool, so the proxy
can run on either (FABRIC_GATEWAY_UPSTREAM_CLIENT=aiohttp). Kept for the side-by-side measurement
in scripts/bench-gateway, which installs aiohttp into its own directory: the gateway's default
client stays common.http1_client (see docs/gateway.md, "Upstream client", for the figures and
why). aiohttp is not a project dependency; this module imports it only when chosen.
"""

from __future__ import annotations

import asyncio
import ssl

from common.http1_client import UpstreamConnectError, UpstreamError, UpstreamTimeoutError


class AiohttpResponse:
    __slots__ = ("_done", "_resp", "headers", "status")

    def __init__(self, resp) -> None:
        self._resp = resp
        self._done = False
        self.status = resp.status
        self.headers = [(k.lower(), v) for k, v in resp.raw_headers]

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    @property
    def at_end(self) -> bool:
        return self._resp.content.at_eof()

    async def next_chunk(self) -> bytes | None:
        import aiohttp

        try:
            data = await self._resp.content.readany()
        except asyncio.TimeoutError:  # aiohttp's timeouts (ServerTimeoutError is one); the builtin on 3.11+
            raise UpstreamTimeoutError("the upstream sent nothing within the idle timeout") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"the upstream broke: {exc}") from None
        if not data:
            self._done = True
            return None
        return data

    def close(self) -> None:
        if self._done or self._resp.content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


class AiohttpPool:
    def __init__(self, ssl_context: ssl.SSLContext | None = None, *, connect_timeout: float = 5.0,
                 idle_timeout: float = 60.0, keepalive_secs: float = 4.0) -> None:
        self._ssl = ssl_context
        self._connect_timeout, self._idle_timeout, self._keepalive = connect_timeout, idle_timeout, keepalive_secs
        self._session = None

    def _get_session(self):
        import aiohttp

        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self._keepalive, ssl=self._ssl or True)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout,
                                            sock_read=self._idle_timeout)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                                  skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        return self._session

    async def request(self, scheme: str, host: str, port: int, method: str, target: bytes,
                      headers: list[tuple[bytes, bytes]], body: bytes) -> AiohttpResponse:
        import aiohttp
        from yarl import URL

        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        url = URL(f"{scheme}://{hostport}{target.decode('latin-1')}", encoded=True)
        hdrs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        try:
            resp = await self._get_session().request(method, url, headers=hdrs, data=body or None)
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamConnectError(f"connect to {hostport} failed: {exc}") from None
        except asyncio.TimeoutError:  # aiohttp's timeouts (ServerTimeoutError is one); the builtin on 3.11+
            raise UpstreamTimeoutError(f"{hostport} did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"the upstream request failed: {exc}") from None
        return AiohttpResponse(resp)

    def close(self) -> None:
        if self._session is not None and not self._session.closed:
            try:
                asyncio.get_running_loop().create_task(self._session.close())
            except RuntimeError:
                pass
