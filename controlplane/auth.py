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
- A read-only "viewer" login exists beside admin: `fabricd init` also writes
  {state_dir}/viewer-password (0600); its tokens carry `"role": "viewer"`, and `require_admin`
  answers 403 "read_only" to any method other than GET/HEAD made with one. Delete the file to
  turn viewer logins off. Tokens without a role claim (issued before roles) are admin tokens.

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
from common.errors import Forbidden, Unauthorized
from common.private_fs import private_dir
from common.store.base import Store
from controlplane.state import StateDep

ADMIN_USER = "admin"
ADMIN_PASSWORD_FILE = "admin-password"
VIEWER_USER = "viewer"
VIEWER_PASSWORD_FILE = "viewer-password"
PASSWORD_FILES = {ADMIN_USER: ADMIN_PASSWORD_FILE, VIEWER_USER: VIEWER_PASSWORD_FILE}
READ_METHODS = frozenset({"GET", "HEAD"})
TOKEN_AUDIENCE = "fabric-admin"
TOKEN_ISSUER = "fabricd"
SECRET_KEY = keyspace.auth("token-secret")


def admin_password_path(state_dir: Path) -> Path:
    return Path(state_dir) / ADMIN_PASSWORD_FILE


def ensure_admin_password(state_dir: Path) -> tuple[Path, bool]:
    """Write a random admin password (0600) unless one exists; returns (path, created)."""
    return ensure_password(state_dir, ADMIN_USER)


def ensure_password(state_dir: Path, user: str) -> tuple[Path, bool]:
    """Write a random password (0600) for `user` (admin or viewer) unless one exists."""
    path = Path(state_dir) / PASSWORD_FILES[user]
    private_dir(Path(state_dir))
    if path.exists():
        return path, False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")
    return path, True


def read_admin_password(state_dir: Path) -> str:
    return read_password(state_dir, ADMIN_USER)


def read_password(state_dir: Path, user: str) -> str:
    path = Path(state_dir) / PASSWORD_FILES[user]
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise Unauthorized(f"no {user} password on this fabricd; run `fabricd init --state-dir DIR`") from None


def ensure_token_secret(store: Store) -> bytes:
    """The HMAC secret shared by all fabricd processes on this store; the first one to ask makes it."""
    store.create(SECRET_KEY, secrets.token_hex(32))
    kv = store.get(SECRET_KEY)
    if kv is None:  # only if someone deleted it between our two calls
        raise RuntimeError("token secret vanished from the store")
    return bytes.fromhex(kv.value)


def issue_token(secret: bytes, subject: str, ttl_s: int, now: float | None = None,
                role: str = ADMIN_USER) -> tuple[str, float]:
    now = time.time() if now is None else now
    expires_at = float(int(now) + ttl_s)
    claims = {"sub": subject, "aud": TOKEN_AUDIENCE, "iss": TOKEN_ISSUER, "role": role,
              "iat": int(now), "exp": int(expires_at), "jti": secrets.token_hex(8)}
    return jwt.encode(claims, secret, algorithm="HS256"), expires_at


def verify_token(secret: bytes, token: str, now: float | None = None) -> str:
    """Return the token's subject; raise Unauthorized (never echoing the token) when it is not valid."""
    return verify_claims(secret, token, now)[0]


def verify_claims(secret: bytes, token: str, now: float | None = None) -> tuple[str, str]:
    """(subject, role) of a valid token; role is "admin" or "viewer"."""
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
    role = str(claims.get("role", ADMIN_USER))
    if role not in PASSWORD_FILES:
        raise Unauthorized("invalid token", code="invalid_token")
    return str(claims["sub"]), role


def check_password(state_dir: Path, username: str, password: str) -> str:
    """The role `username` signs in as (admin or viewer); Unauthorized for anything else."""
    user = username if username in PASSWORD_FILES else ADMIN_USER
    try:
        expected = read_password(state_dir, user)
    except Unauthorized:
        if user == ADMIN_USER:
            raise
        expected = None  # viewer logins are off: compare anyway so timing says nothing
    user_ok = hmac.compare_digest(username.encode(), user.encode())
    pass_ok = hmac.compare_digest(password.encode(), (expected or secrets.token_hex(16)).encode())
    if not (user_ok and pass_ok and expected is not None):
        raise Unauthorized("wrong username or password", code="bad_credentials")
    return user


def bearer_from(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("missing bearer token; log in with POST /api/auth/login", code="no_token")
    return token.strip()


def require_admin(request: Request, state: StateDep) -> str:
    """Route dependency: the authenticated operator's name, or 401; 403 for a viewer's write."""
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    subject, role = verify_claims(state.token_secret, bearer_from(request))
    if role != ADMIN_USER and request.method not in READ_METHODS:
        raise Forbidden(f"the {role} account is read-only; sign in as admin to change anything", code="read_only")
    return subject


def login_token(state, username: str, password: str) -> tuple[str, float, str]:
    """(token, expires_at, role) for a correct login: shared by the API and the console."""
    role = check_password(state.state_dir, username, password)
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    token, expires_at = issue_token(state.token_secret, username, state.settings.token_ttl_s, role=role)
    return token, expires_at, role


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
    token, expires_at, _ = login_token(state, body.username, body.password)
    return LoginResponse(token=token, expires_at=expires_at)
