"""The console's writes (POST only), each one REST API call made with the operator's own token.

Order for every write: a session (else to the sign-in page), the CSRF token (else 403 "csrf"),
then the API call; the API's answer, refusal included (a viewer's 403 "read_only", a 422 naming
the bad field, a quota 409), is what the operator sees. Nothing here re-implements a rule.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse

from common.errors import Forbidden, LimitExceeded, Unauthorized
from controlplane.auth import login_token
from controlplane.auth import logout as logout_token
from controlplane.console import session as sessions
from controlplane.console.backend import Api, ApiError
from controlplane.console.render import PREFIX, page, read_form, session_of, to_login
from controlplane.state import get_state

router = APIRouter(prefix=PREFIX, include_in_schema=False)


@router.post("/login")
async def login(request: Request):
    form = await read_form(request)
    try:
        sessions.check_login_csrf(request, form.get("csrf", ""))
        token, expires_at, _ = await login_token(get_state(request), form.get("username", ""), form.get("password", ""),
                                                 request.client.host if request.client else None)
    except (Unauthorized, Forbidden, LimitExceeded) as exc:
        fresh = sessions.new_login_csrf()
        resp = page(request, "login.html", None, status=exc.status, login_csrf=fresh, error=exc.message)
        sessions.set_cookie(resp, sessions.LOGIN_CSRF_COOKIE, fresh, 1800)
        return resp
    resp = RedirectResponse(PREFIX, status_code=303)
    max_age = max(1, int(expires_at - time.time()))
    sessions.set_cookie(resp, sessions.SESSION_COOKIE, token, max_age)
    resp.delete_cookie(sessions.LOGIN_CSRF_COOKIE, path=sessions.COOKIE_PATH)
    return resp


async def _guarded(request: Request):
    """(session, form) for a write with a valid CSRF token; a response to return otherwise."""
    session = session_of(request)
    if session is None:
        return None, None, to_login()
    form = await read_form(request)
    try:
        sessions.check_csrf(request, session, form)
    except Forbidden as exc:
        return session, form, page(request, "error.html", session, status=403, active="",
                                   error=ApiError(403, exc.code, exc.message))
    return session, form, None


def _failed(request: Request, session, active: str, exc: ApiError):
    return page(request, "error.html", session, status=exc.status, active=active, error=exc)


@router.post("/logout")
async def logout(request: Request):
    session, _, refused = await _guarded(request)
    if refused is not None:
        return refused
    if session is not None:  # the cookie's token stops working, not only the cookie
        await asyncio.to_thread(logout_token, get_state(request), session.token)
    resp = to_login()
    resp.delete_cookie(sessions.SESSION_COOKIE, path=sessions.COOKIE_PATH)
    return resp


@router.post("/deployments/{name}/scale")
async def scale(request: Request, name: str):
    session, form, refused = await _guarded(request)
    if refused is not None:
        return refused
    try:
        replicas = int(form.get("replicas", ""))
    except ValueError:
        return _failed(request, session, "deployments", ApiError(422, "invalid", "replicas: expected a whole number"))
    try:
        await Api(request, session).call("POST", f"/api/ai/deployments/{quote(name, safe='')}/scale",
                                         json={"replicas": replicas})
    except ApiError as exc:
        return _failed(request, session, "deployments", exc)
    msg = quote(f"deployment {name} scaled to {replicas} replicas")
    return RedirectResponse(f"{PREFIX}/deployments?message={msg}", status_code=303)


async def _show_secret(request: Request, session, api: Api, answer: dict, verb: str):
    """The keys page with the plaintext key of this one answer: it is never stored nor shown again."""
    items, eps = await api.get("/api/ai/keys"), await api.get("/api/ai/endpoints")
    return page(request, "keys.html", session, active="keys", keys=items, endpoints=[e["name"] for e in eps],
                secret={"name": answer.get("name"), "id": answer.get("id"), "key": answer.get("key"), "verb": verb})


async def _key_write(request: Request, session, path: str, body: dict, verb: str):
    """Create or rotate: one API call whose answer carries the plaintext key, shown on this page only."""
    api = Api(request, session)
    try:
        answer = await api.call("POST", path, json=body)
        return await _show_secret(request, session, api, answer, verb)
    except ApiError as exc:
        return _failed(request, session, "keys", exc)


@router.post("/keys")
async def create_key(request: Request):
    session, form, refused = await _guarded(request)
    if refused is not None:
        return refused
    body: dict = {"name": form.get("name", ""), "endpoint": form.get("endpoint", "")}
    if form.get("ttl_secs"):
        try:
            body["ttl_secs"] = int(form["ttl_secs"])
        except ValueError:
            return _failed(request, session, "keys", ApiError(422, "invalid", "ttl_secs: expected a whole number"))
    return await _key_write(request, session, "/api/ai/keys", body, "created")


@router.post("/keys/{ref}/rotate")
async def rotate_key(request: Request, ref: str):
    session, _, refused = await _guarded(request)
    if refused is not None:
        return refused
    return await _key_write(request, session, f"/api/ai/keys/{quote(ref, safe='')}/rotate", {}, "rotated")


@router.post("/keys/{ref}/revoke")
async def revoke_key(request: Request, ref: str):
    session, _, refused = await _guarded(request)
    if refused is not None:
        return refused
    try:
        await Api(request, session).call("DELETE", f"/api/ai/keys/{quote(ref, safe='')}")
    except ApiError as exc:
        return _failed(request, session, "keys", exc)
    return RedirectResponse(f"{PREFIX}/keys", status_code=303)
