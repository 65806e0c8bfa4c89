"""The console's only way to read or change anything: the REST API, called in-process.

`Api(request, session)` sends requests through the same FastAPI app over ASGI (no socket), with
the session's bearer token, so auth, validation, quotas and the viewer's read-only rule apply
exactly as they do to fabricctl. API errors come back as ApiError with the API's code/message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from fastapi import Request

from controlplane.console.session import Session

INTERNAL_BASE = "http://fabricd.console"


@dataclass
class ApiError(Exception):
    status: int
    code: str
    message: str
    fields: list = field(default_factory=list)  # a 422's [{field, message}] (controlplane.errors_http)


class Api:
    def __init__(self, request: Request, session: Session):
        self._app = request.app
        self._headers = {"Authorization": f"Bearer {session.token}"}

    async def call(self, method: str, path: str, json: dict | None = None, params: dict | None = None):
        transport = httpx.ASGITransport(app=self._app)
        async with httpx.AsyncClient(transport=transport, base_url=INTERNAL_BASE, timeout=30) as client:
            resp = await client.request(method, path, json=json, params=params, headers=self._headers)
        if resp.status_code >= 400:
            try:
                err = resp.json().get("error", {})
            except ValueError:
                err = {}
            raise ApiError(resp.status_code, str(err.get("code", "error")), str(err.get("message", resp.text[:200])),
                           [f for f in err.get("fields") or [] if isinstance(f, dict)])
        return resp.json()

    async def get(self, path: str, params: dict | None = None):
        return await self.call("GET", path, params=params)

    async def maybe(self, path: str, default=None):
        """GET, or `default` when that API is absent or refuses (a page still renders)."""
        try:
            return await self.get(path)
        except ApiError:
            return default
