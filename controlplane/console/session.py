"""Console sessions: the API's own bearer token kept in a cookie, plus a CSRF token bound to it.

- The session cookie holds the admin/viewer JWT that POST /api/auth/login would return (same
  login, same expiry, same verification); it is HttpOnly, Secure, SameSite=Strict, Path=/app/ai.
- The CSRF token is HMAC-SHA256(token secret, "csrf:" + session token): nothing to store, it
  dies with the session, and only fabricd can make it. Every console write must carry it as the
  form field `csrf` or the header `X-CSRF-Token` (htmx sends the header); a missing or wrong one
  is 403 "csrf". The sign-in form uses a double-submit token in its own short-lived cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request, Response

from common.errors import Forbidden
from controlplane.auth import ensure_token_secret, verified_claims
from controlplane.state import AppState
from controlplane.tenancy import revocation

SESSION_COOKIE = "fabric_session"
LOGIN_CSRF_COOKIE = "fabric_login_csrf"
COOKIE_PATH = "/app/ai"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class Session:
    token: str
    user: str
    role: str
    csrf: str

    @property
    def can_write(self) -> bool:
        """Admins and operators see write buttons; the API still decides (tenancy/route_rules.py)."""
        return self.role in ("admin", "operator")


def _secret(state: AppState) -> bytes:
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    return state.token_secret


def csrf_for(secret: bytes, token: str) -> str:
    return hmac.new(secret, b"csrf:" + token.encode(), hashlib.sha256).hexdigest()


def current(request: Request, state: AppState) -> Session | None:
    """The signed-in session, or None when the cookie is absent, forged or expired."""
    token = request.cookies.get(SESSION_COOKIE, "")
    if not token:
        return None
    secret = _secret(state)
    try:
        claims = verified_claims(secret, token)
        revocation.check(state.store, claims)  # signed out, or the user was deleted
        user, role = str(claims["sub"]), str(claims.get("role", "admin"))
    except Exception:  # noqa: BLE001 - any invalid token means "not signed in"
        return None
    return Session(token=token, user=user, role=role, csrf=csrf_for(secret, token))


def check_csrf(request: Request, session: Session, form: dict) -> None:
    sent = str(form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or "")
    if not sent or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise Forbidden("missing or wrong CSRF token; reload the page and try again", code="csrf")


def set_cookie(response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path=COOKIE_PATH, secure=True, httponly=True,
                        samesite="strict")


def new_login_csrf() -> str:
    return secrets.token_urlsafe(24)


def check_login_csrf(request: Request, sent: str) -> None:
    expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    if not expected or not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Forbidden("missing or wrong CSRF token on sign-in; reload the page", code="csrf")
