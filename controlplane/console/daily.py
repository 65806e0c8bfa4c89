"""The console's daily writes beside the forms: delete with confirmation, node drain/uncordon, and
a tenant's usage and remaining room.

    GET  /app/ai/{kind}/{name}/delete     "Delete …?" with what it does (models, profiles, deployments,
                                          endpoints, keys); its form posts below (keys: to /keys/{id}/revoke)
    POST /app/ai/{kind}/{name}/delete     DELETE /api/ai/{kind}/{name}
    POST /app/ai/nodes/{id}/drain         POST /api/ai/nodes/{id}/drain {reason, grace_secs}: cordon, then drain
    POST /app/ai/nodes/{id}/uncordon      POST /api/ai/nodes/{id}/uncordon
    GET  /app/ai/usage                    GET /api/ai/usage (the usage ledger's rollup per day, tenant and
                                          model, with cost) and GET /api/ai/quotas (use and room per tenant)

Every write goes through actions._guarded (session, then CSRF) and the API with the operator's own
token, so who may delete or drain is the API's rule (a node drain is admin-only there).
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from controlplane.console.actions import _failed, _guarded
from controlplane.console.backend import Api, ApiError
from controlplane.console.render import PREFIX, page, session_of, to_login

router = APIRouter(prefix=PREFIX, include_in_schema=False)

DELETES = {  # console kind -> (what, what deleting it does)
    "models": ("model", "Its record goes; deployments that use it keep running until they are deleted."),
    "profiles": ("profile", "Its record goes; deployments that use it keep their replicas."),
    "deployments": ("deployment", "Every replica is stopped and its GPUs are freed; endpoints on it stop answering."),
    "endpoints": ("endpoint", "Its VIP drains and is released; clients calling it are refused."),
    "keys": ("API key", "The gateway refuses the key from its next refresh (about a second)."),
}
USAGE_DAYS = 7


def _action(kind: str, name: str) -> str:
    ref = quote(name, safe="")
    return f"{PREFIX}/keys/{ref}/revoke" if kind == "keys" else f"{PREFIX}/{kind}/{ref}/delete"


@router.get("/{kind}/{name}/delete", response_class=HTMLResponse)
async def confirm_delete(request: Request, kind: str, name: str):
    session = session_of(request)
    if session is None:
        return to_login()
    if kind not in DELETES:
        return _failed(request, session, "", ApiError(404, "not_found", f"nothing to delete at {kind}"))
    what, effect = DELETES[kind]
    try:  # the thing must exist and be the caller's to see: the API says so
        await Api(request, session).get(f"/api/ai/{kind}/{quote(name, safe='')}")
    except ApiError as exc:
        return _failed(request, session, kind, exc)
    return page(request, "confirm.html", session, active=kind, what=what, name=name, effect=effect,
                action=_action(kind, name), back=f"{PREFIX}/{kind}")


@router.post("/{kind}/{name}/delete")
async def delete(request: Request, kind: str, name: str):
    session, _, refused = await _guarded(request)
    if refused is not None:
        return refused
    if kind not in DELETES or kind == "keys":
        return _failed(request, session, "", ApiError(404, "not_found", f"nothing to delete at {kind}"))
    try:
        await Api(request, session).call("DELETE", f"/api/ai/{kind}/{quote(name, safe='')}")
    except ApiError as exc:
        return _failed(request, session, kind, exc)
    msg = quote(f"{DELETES[kind][0]} {name} deleted")
    return RedirectResponse(f"{PREFIX}/{kind}?message={msg}", status_code=303)


@router.post("/nodes/{node_id}/drain")
async def drain_node(request: Request, node_id: str):
    session, form, refused = await _guarded(request)
    if refused is not None:
        return refused
    body: dict = {"reason": form.get("reason", "").strip() or "drained from the console"}
    try:
        if form.get("grace_secs", "").strip():
            body["grace_secs"] = float(form["grace_secs"])
    except ValueError:
        return _failed(request, session, "nodes", ApiError(422, "invalid", "grace_secs: expected a number"))
    try:
        answer = await Api(request, session).call("POST", f"/api/ai/nodes/{quote(node_id, safe='')}/drain",
                                                  json=body)
    except ApiError as exc:
        return _failed(request, session, "nodes", exc)
    msg = quote(f"node {node_id} cordoned ({answer.get('cordoned')}); {len(answer.get('drained', []))} "
                "replicas draining")
    return RedirectResponse(f"{PREFIX}/nodes?message={msg}", status_code=303)


@router.post("/nodes/{node_id}/uncordon")
async def uncordon_node(request: Request, node_id: str):
    session, _, refused = await _guarded(request)
    if refused is not None:
        return refused
    try:
        await Api(request, session).call("POST", f"/api/ai/nodes/{quote(node_id, safe='')}/uncordon")
    except ApiError as exc:
        return _failed(request, session, "nodes", exc)
    return RedirectResponse(f"{PREFIX}/nodes?message={quote(f'node {node_id} open to new replicas')}",
                            status_code=303)


@router.get("/usage", response_class=HTMLResponse)
async def usage(request: Request):
    session = session_of(request)
    if session is None:
        return to_login()
    api = Api(request, session)
    tenant = request.query_params.get("tenant", "").strip()
    params: dict = {"since": time.time() - USAGE_DAYS * 86400, "granularity": "day", "group_by": "tenant,model"}
    if tenant:
        params["tenant"] = tenant
    try:
        # Quotas are cluster-wide reading (a tenant-bound user is refused them): shown where allowed.
        report, quotas = await asyncio.gather(api.get("/api/ai/usage", params), api.maybe("/api/ai/quotas", []))
    except ApiError as exc:
        return _failed(request, session, "usage", exc)
    if tenant:
        quotas = [q for q in quotas if q.get("tenant") == tenant]
    rows = sorted(report.get("rows", []), key=lambda r: (r.get("start", 0), r.get("tenant") or "", r.get("model") or ""),
                  reverse=True)
    totals: dict[str, dict] = {}
    for r in rows:
        t = totals.setdefault(r.get("tenant") or "(none)", {"calls": 0, "tokens": 0, "cost": 0.0, "gpu_seconds": 0.0})
        for k in t:
            t[k] += r.get(k) or 0
    return page(request, "usage.html", session, active="usage", rows=rows, totals=totals, quotas=quotas,
                tenant=tenant, days=USAGE_DAYS)
