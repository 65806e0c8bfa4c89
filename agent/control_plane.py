"""The agent's connection to the control plane: every fabricd address, failing over between them.

Each fabricd serves the same API over one store, so any of them answers a registration or a
heartbeat. `FailoverClient` keeps one httpx.Client per URL and sticks to the one that last
worked; when it cannot be reached (a transport error) or answers 502/503/504 (a fabricd that
is up but cannot reach etcd), the same request goes to the next URL, and the first that answers
becomes the current one. Any other answer (a 4xx, a 200) is the control plane's and is returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import httpx

log = logging.getLogger("fabric-agent.control-plane")

RETRY_STATUSES = frozenset({502, 503, 504})


def split_urls(values: Sequence[str]) -> list[str]:
    """--control-plane values (repeatable, or comma-separated), de-duplicated, in order."""
    urls = [u.strip().rstrip("/") for v in values for u in v.split(",") if u.strip()]
    return list(dict.fromkeys(urls))


class FailoverClient:
    def __init__(self, urls: Sequence[str], *, verify, timeout: float = 10.0,
                 transport: httpx.BaseTransport | None = None):
        if not urls:
            raise ValueError("at least one control-plane URL")
        self.urls = list(urls)
        self._clients = [httpx.Client(base_url=u, verify=verify, timeout=timeout, transport=transport)
                         for u in self.urls]
        self.current = 0
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return self.urls[self.current]

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        with self._lock:
            start = self.current
        last_error: Exception | None = None
        last_response: httpx.Response | None = None
        for step in range(len(self._clients)):
            index = (start + step) % len(self._clients)
            try:
                response = self._clients[index].request(method, path, **kwargs)
            except httpx.TransportError as exc:
                last_error = exc
                log.info("control plane %s unreachable (%s); trying the next", self.urls[index], exc)
                continue
            if response.status_code in RETRY_STATUSES and step < len(self._clients) - 1:
                last_response = response
                log.info("control plane %s answered %s; trying the next", self.urls[index], response.status_code)
                continue
            with self._lock:
                if index != self.current:
                    log.warning("control plane: now using %s (was %s)", self.urls[index], self.urls[self.current])
                self.current = index
            return response
        if last_response is not None:
            return last_response
        assert last_error is not None
        raise last_error

    def post(self, path: str, **kwargs) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def get(self, path: str, **kwargs) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def close(self) -> None:
        for client in self._clients:
            client.close()
