"""Operator authentication for the REST API: admin password, login, expiring bearer tokens.

- `fabricd init` writes a random admin password to {state_dir}/admin-password (0600). fabricd
  reads it from that file at login time, so rotating it is editing the file.
- POST /api/auth/login {"username": "admin", "password": ...} returns {"token", "expires_at"}.
- Tokens are HS256 JWTs with audience "fabric-admin" (so an inference JWT with audience
  "fabric-inference" is never accepted here, nor an admin token by the gateway). The signing
  secret lives in the store at keyspace.auth("token-secret"), made with create-if-absent, so every
  fabricd process sharing a store verifies every other's tokens. Whoever can read the store can
  forge tokens; the store is already admin-level state (it holds every desired state).
- `require_admin` is the route dependency: 401 for a missing, malformed, forged or expired token.

Neither the password nor tokens ever reach a log line or an error message.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from pathlib import Path

import jwt
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from common import keyspace
from common.errors import Unauthorized
from common.store.base import Store
from controlplane.state import StateDep

ADMIN_USER = "admin"
ADMIN_PASSWORD_FILE = "admin-password"
TOKEN_AUDIENCE = "fabric-admin"
TOKEN_ISSUER = "fabricd"
SECRET_KEY = keyspace.auth("token-secret")


def admin_password_path(state_dir: Path) -> Path:
    return Path(state_dir) / ADMIN_PASSWORD_FILE


def ensure_admin_password(state_dir: Path) -> tuple[Path, bool]:
    """Write a random admin password (0600) unless one exists; returns (path, created)."""
    path = admin_password_path(state_dir)
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    if path.exists():
        return path, False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")
    return path, True


def read_admin_password(state_dir: Path) -> str:
    path = admin_password_path(state_dir)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise Unauthorized("no admin password on this fabricd; run `fabricd init --state-dir DIR`") from None


def ensure_token_secret(store: Store) -> bytes:
    """The HMAC secret shared by all fabricd processes on this store; the first one to ask makes it."""
    store.create(SECRET_KEY, secrets.token_hex(32))
    kv = store.get(SECRET_KEY)
    if kv is None:  # only if someone deleted it between our two calls
        raise RuntimeError("token secret vanished from the store")
    return bytes.fromhex(kv.value)


def issue_token(secret: bytes, subject: str, ttl_s: int, now: float | None = None) -> tuple[str, float]:
    now = time.time() if now is None else now
    expires_at = float(int(now) + ttl_s)
    claims = {"sub": subject, "aud": TOKEN_AUDIENCE, "iss": TOKEN_ISSUER,
              "iat": int(now), "exp": int(expires_at), "jti": secrets.token_hex(8)}
    return jwt.encode(claims, secret, algorithm="HS256"), expires_at


def verify_token(secret: bytes, token: str, now: float | None = None) -> str:
    """Return the token's subject; raise Unauthorized (never echoing the token) when it is not valid."""
    options = {"require": ["exp", "sub", "aud", "iss"]}
    try:
        if now is None:
            claims = jwt.decode(token, secret, algorithms=["HS256"], audience=TOKEN_AUDIENCE,
                                issuer=TOKEN_ISSUER, options=options)
        else:
            claims = jwt.decode(token, secret, algorithms=["HS256"], audience=TOKEN_AUDIENCE,
                                issuer=TOKEN_ISSUER, options={**options, "verify_exp": False})
            if claims["exp"] <= now:
                raise jwt.ExpiredSignatureError()
    except jwt.ExpiredSignatureError:
        raise Unauthorized("token expired; log in again", code="token_expired") from None
    except jwt.PyJWTError:
        raise Unauthorized("invalid token", code="invalid_token") from None
    return str(claims["sub"])


def check_password(state_dir: Path, username: str, password: str) -> None:
    expected = read_admin_password(state_dir)
    user_ok = hmac.compare_digest(username.encode(), ADMIN_USER.encode())
    pass_ok = hmac.compare_digest(password.encode(), expected.encode())
    if not (user_ok and pass_ok):
        raise Unauthorized("wrong username or password", code="bad_credentials")


def bearer_from(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token; log in with POST /api/auth/login", code="no_token")
    return token.strip()


def require_admin(request: Request, state: StateDep) -> str:
    """Route dependency: the authenticated operator's name, or 401."""
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    return verify_token(state.token_secret, bearer_from(request))


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str
    password: str


class LoginResponse(BaseModel):
    token: str
    expires_at: float


router = APIRouter(prefix="/api/auth", tags=["auth"])


@router.post("/login", response_model=LoginResponse)
def login(body: LoginRequest, state: StateDep) -> LoginResponse:
    check_password(state.state_dir, body.username, body.password)
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    token, expires_at = issue_token(state.token_secret, body.username, state.settings.token_ttl_s)
    return LoginResponse(token=token, expires_at=expires_at)
