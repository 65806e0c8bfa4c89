"""Template rendering and the page guard shared by pages and actions."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from controlplane.console import session as sessions
from controlplane.console.session import Session
from controlplane.console.views import rollout_state
from controlplane.state import get_state

PREFIX = "/app/ai"
MAX_FORM_BYTES = 16 * 1024
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))  # autoescape on for .html

NAV = [("overview", "Overview", ""), ("models", "Models", "/models"), ("profiles", "Profiles", "/profiles"),
       ("deployments", "Deployments", "/deployments"), ("endpoints", "Endpoints", "/endpoints"),
       ("keys", "API keys", "/keys"), ("nodes", "Nodes & GPUs", "/nodes"), ("usage", "Usage", "/usage"),
       ("events", "Events", "/events")]
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def session_of(request: Request) -> Session | None:
    return sessions.current(request, get_state(request))


def to_login() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/login", status_code=303)


def page(request: Request, template: str, session: Session | None, status: int = 200, **ctx) -> HTMLResponse:
    ctx.setdefault("message", request.query_params.get("message", "")[:300])  # what a write redirected with
    resp = templates.TemplateResponse(request, template, {
        "session": session, "nav": NAV, "prefix": PREFIX, **ctx}, status_code=status)
    resp.headers.update(SECURITY_HEADERS)
    return resp


async def read_form(request: Request) -> dict[str, str]:
    """A url-encoded form body (what the console's forms send), first value per field."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=50)
    return {k: v[0] for k, v in parsed.items()}


def _utc(ts) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(ts)))
    except (TypeError, ValueError):
        return ""


templates.env.filters["utc"] = _utc
templates.env.filters["rollout_state"] = rollout_state
