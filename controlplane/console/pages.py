"""The console's pages (GET only): each reads the REST API with the operator's token and renders.

A request without a valid session is sent to /app/ai/login. `/app/ai/endpoints/{name}/weights` is
the fragment htmx polls every few seconds to redraw an endpoint's Maglev weights.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from controlplane.console import charts, forms, views
from controlplane.console import playground as playground_mod
from controlplane.console import session as sessions
from controlplane.console.backend import Api, ApiError
from controlplane.console.render import PREFIX, page, session_of, to_login
from controlplane.state import get_state

router = APIRouter(prefix=PREFIX, include_in_schema=False)
LOGIN_CSRF_MAX_AGE = 1800
WEIGHTS_REFRESH_S = 3


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request):
    token = sessions.new_login_csrf()
    resp = page(request, "login.html", None, login_csrf=token, error="")
    sessions.set_cookie(resp, sessions.LOGIN_CSRF_COOKIE, token, LOGIN_CSRF_MAX_AGE)
    return resp


async def _render(request: Request, template: str, active: str, load):
    session = session_of(request)
    if session is None:
        return to_login()
    api = Api(request, session)
    try:
        ctx = await load(api)
    except ApiError as exc:
        return page(request, "error.html", session, status=exc.status, active=active, error=exc)
    return page(request, template, session, active=active, **ctx)


@router.get("", response_class=HTMLResponse)
async def overview(request: Request):
    async def load(api: Api):
        capacity, deployments, events = await asyncio.gather(
            api.get("/api/ai/capacity"), api.get("/api/ai/deployments"),
            api.get("/api/ai/events", {"limit": 10}))
        return {"strip": views.capacity_strip(capacity), "capacity": capacity, "deployments": deployments,
                "events": events}
    return await _render(request, "overview.html", "overview", load)


@router.get("/models", response_class=HTMLResponse)
async def models(request: Request):
    async def load(api: Api):
        items, jobs = await asyncio.gather(api.get("/api/ai/models"), api.maybe("/api/ai/model-jobs", []))
        return {"models": items, "jobs": jobs}
    return await _render(request, "models.html", "models", load)


@router.get("/profiles", response_class=HTMLResponse)
async def profiles(request: Request):
    async def load(api: Api):
        return {"profiles": await api.get("/api/ai/profiles")}
    return await _render(request, "profiles.html", "profiles", load)


@router.get("/deployments", response_class=HTMLResponse)
async def deployments(request: Request, message: str = ""):
    async def load(api: Api):
        items, replicas = await asyncio.gather(api.get("/api/ai/deployments"), api.get("/api/ai/replicas"))
        rows = []
        for dep in items:
            mine = [r for r in replicas if r.get("deployment") == dep["name"]]
            name = quote(dep["name"], safe="")
            rollouts = await api.maybe(f"/api/ai/deployments/{name}/rollouts", [])
            scaling = await api.maybe(f"/api/ai/explain/scaling/{name}") if dep.get("autoscaling") else None
            rows.append({"dep": dep, "revisions": views.replicas_by_revision(mine),
                         "rollouts": rollouts[-3:] if isinstance(rollouts, list) else [],
                         "decision": (scaling or {}).get("decision")})
        return {"rows": rows, "message": message[:300]}
    return await _render(request, "deployments.html", "deployments", load)


@router.get("/endpoints", response_class=HTMLResponse)
async def endpoints(request: Request):
    async def load(api: Api):
        items = await api.get("/api/ai/endpoints")
        gateway = get_state(request).settings.gateway_url
        return {"endpoints": [{"ep": ep, "path": views.gateway_base(ep["name"], gateway)} for ep in items],
                "refresh_s": WEIGHTS_REFRESH_S}
    return await _render(request, "endpoints.html", "endpoints", load)


@router.get("/endpoints/{name}/weights", response_class=HTMLResponse)
async def endpoint_weights(request: Request, name: str):
    async def load(api: Api):
        routing = await api.get(f"/api/ai/explain/routing/{quote(name, safe='')}")
        return {"routing": routing, "bars": views.weight_bars(routing), "at": time.strftime("%H:%M:%S")}
    return await _render(request, "weights.html", "endpoints", load)


@router.get("/keys", response_class=HTMLResponse)
async def keys(request: Request):
    async def load(api: Api):
        items, eps = await asyncio.gather(api.get("/api/ai/keys"), api.get("/api/ai/endpoints"))
        return {"keys": items, "endpoints": [e["name"] for e in eps], "secret": None}
    return await _render(request, "keys.html", "keys", load)


@router.get("/nodes", response_class=HTMLResponse)
async def nodes(request: Request):
    async def load(api: Api):
        items, gpus, capacity = await asyncio.gather(api.get("/api/ai/nodes"), api.get("/api/ai/gpus"),
                                                     api.get("/api/ai/capacity"))
        slices = await asyncio.gather(*(api.maybe(f"/api/ai/nodes/{quote(n['id'], safe='')}/mig", [])
                                        for n in items))
        return {"nodes": items, "gpus": gpus, "strip": views.capacity_strip(capacity),
                "slices": [s for per_node in slices for s in per_node],
                "by_class": capacity.get("gpus_by_class") or {},
                "charts": charts.node_charts([n["id"] for n in items])}
    return await _render(request, "nodes.html", "nodes", load)


@router.get("/events", response_class=HTMLResponse)
async def events(request: Request):
    async def load(api: Api):
        return {"events": await api.get("/api/ai/events", {"limit": 200})}
    return await _render(request, "events.html", "events", load)


async def not_found(request: Request, rest: str):
    """A console address that is no page: the console's own 404 page, with its navigation."""
    where = f"{PREFIX}/{rest}"[:200]
    return page(request, "error.html", session_of(request), status=404,
                error={"status": 404, "code": "not_found", "message": f"there is no console page {where}"})


@router.get("/deployments/{name}", response_class=HTMLResponse)
async def deployment(request: Request, name: str, message: str = ""):
    async def load(api: Api):
        ctx = await forms.deployment_context(api, name)
        ctx["message"] = message[:300]
        return ctx
    return await _render(request, "deployment.html", "deployments", load)


@router.get("/endpoints/{name}", response_class=HTMLResponse)
async def endpoint(request: Request, name: str, message: str = ""):
    async def load(api: Api):
        ep = await api.get(f"/api/ai/endpoints/{quote(name, safe='')}")
        return {"e": ep, "path": views.gateway_base(name, get_state(request).settings.gateway_url), "refresh_s": WEIGHTS_REFRESH_S, "message": message[:300],
                "charts": await charts.endpoint_charts(get_state(request).settings.prometheus_url, name)}
    return await _render(request, "endpoint.html", "endpoints", load)


@router.get("/endpoints/{name}/charts", response_class=HTMLResponse)
async def endpoint_charts(request: Request, name: str):
    async def load(api: Api):
        await api.get(f"/api/ai/endpoints/{quote(name, safe='')}")  # the caller may read it
        return {"charts": await charts.endpoint_charts(get_state(request).settings.prometheus_url, name)}
    return await _render(request, "_charts.html", "endpoints", load)


@router.get("/models/jobs", response_class=HTMLResponse)
async def model_jobs(request: Request):
    """The fragment htmx polls on the Models page: each supply-chain job's state, bytes, files."""
    async def load(api: Api):
        items, jobs = await asyncio.gather(api.get("/api/ai/models"), api.maybe("/api/ai/model-jobs", []))
        return {"models": items, "jobs": jobs or []}
    return await _render(request, "_model_jobs.html", "models", load)


@router.get("/endpoints/{name}/try", response_class=HTMLResponse)
async def playground(request: Request, name: str):
    async def load(api: Api):
        ep = await api.get(f"/api/ai/endpoints/{quote(name, safe='')}")
        config = get_state(request).settings
        model = await playground_mod.served_model(api, name)
        policy = await api.maybe(f"/api/ai/key-policies/{quote(name, safe='')}", None) or {}
        viewers = bool(policy.get("viewer_playground"))
        return {"e": ep, "gateway": config.gateway_url, "snippets": views.snippets(config.gateway_url or
                                                                                   "https://GATEWAY", name, model),
                "key_ttl_s": playground_mod.KEY_TTL_S, "viewers_may_try": viewers}
    return await _render(request, "playground.html", "endpoints", load)
