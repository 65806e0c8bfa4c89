"""Operator authentication for the REST API: admin password, login, expiring bearer tokens.

- `fabricd init` writes a random admin password to {state_dir}/admin-password (0600). fabricd
  reads it from that file at login time, so rotating it is editing the file.
- POST /api/auth/login {"username": "admin", "password": ...} returns {"token", "expires_at"}.
- Tokens are HS256 JWTs with audience "fabric-admin" (so an inference JWT with audience
  "fabric-inference" is never accepted here, nor an admin token by the gateway). The signing
  secret lives in the store at keyspace.auth("token-secret"), made with create-if-absent, so every
  fabricd process sharing a store verifies every other's tokens. Whoever can read the store can
  forge tokens; the store is already admin-level state (it holds every desired state).
- `require_admin` is the route dependency: 401 for a missing, malformed, forged, expired or
  revoked token (controlplane.tenancy.revocation: a deleted user's tokens, a logged-out token;
  POST /api/auth/logout revokes the presented one).
- A read-only "viewer" login exists beside admin: `fabricd init` also writes
  {state_dir}/viewer-password (0600); its tokens carry `"role": "viewer"`, and `require_admin`
  answers 403 "read_only" to any method other than GET/HEAD made with one. Delete the file to
  turn viewer logins off. Tokens without a role claim (issued before roles) are admin tokens.
- Local users (controlplane.tenancy.users: `fabricctl ai user add NAME --role R --tenant T`) log
  in the same way; their tokens also carry a `tenant` claim. OIDC logins (POST /api/auth/oidc,
  controlplane.tenancy.oidc_login) exchange an identity provider's ID token for the same token.
- `require_admin` (the name predates roles) is the route dependency that enforces THE table of
  who may call what (controlplane.tenancy.route_rules): 401 without a valid token, 403 for a role
  or a tenant-bound user the route's rule refuses, 404 for another tenant's object; the caller
  is kept on request.state for the handler (`PrincipalDep`).

Neither the password nor tokens ever reach a log line or an error message.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from pathlib import Path
from typing import Annotated

import jwt
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from common.errors import Forbidden, Unauthorized
from common.private_fs import private_dir
from common.records import auth_tokens
from common.store.base import Store
from controlplane.state import StateDep
from controlplane.tenancy import oidc_login, owners, revocation, route_rules, users
from controlplane.tenancy.principal import ROLES, Principal

ADMIN_USER = "admin"
ADMIN_PASSWORD_FILE = "admin-password"
VIEWER_USER = "viewer"
VIEWER_PASSWORD_FILE = "viewer-password"
PASSWORD_FILES = {ADMIN_USER: ADMIN_PASSWORD_FILE, VIEWER_USER: VIEWER_PASSWORD_FILE}
TOKEN_AUDIENCE = "fabric-admin"
TOKEN_ISSUER = "fabricd"
SECRET_KEY = auth_tokens.SECRET_KEY


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
    return auth_tokens.token_secret(store)


def issue_token(secret: bytes, subject: str, ttl_s: int, now: float | None = None,
                role: str = ADMIN_USER, tenant: str | None = None, generation: int = 0) -> tuple[str, float]:
    now = time.time() if now is None else now
    expires_at = float(int(now) + ttl_s)
    claims = {"sub": subject, "aud": TOKEN_AUDIENCE, "iss": TOKEN_ISSUER, "role": role,
              "iat": int(now), "exp": int(expires_at), "jti": secrets.token_hex(8)}
    if generation:  # the subject's revocation generation (controlplane.tenancy.revocation)
        claims["gen"] = generation
    if tenant is not None:
        claims["tenant"] = tenant
    return jwt.encode(claims, secret, algorithm="HS256"), expires_at


def verify_token(secret: bytes, token: str, now: float | None = None) -> str:
    """Return the token's subject; raise Unauthorized (never echoing the token) when it is not valid."""
    return verify_claims(secret, token, now)[0]


def verify_claims(secret: bytes, token: str, now: float | None = None) -> tuple[str, str]:
    """(subject, role) of a valid token; role is admin, operator or viewer."""
    principal = verify_principal(secret, token, now)
    return principal.subject, principal.role


def verify_principal(secret: bytes, token: str, now: float | None = None) -> Principal:
    """The caller a valid token names (subject, role, tenant); Unauthorized otherwise."""
    return principal_of(verified_claims(secret, token, now))


def principal_of(claims: dict) -> Principal:
    role = str(claims.get("role", ADMIN_USER))
    tenant = claims.get("tenant")
    if role not in ROLES or not (tenant is None or isinstance(tenant, str)):
        raise Unauthorized("invalid token", code="invalid_token")
    return Principal(str(claims["sub"]), role, None if role == ADMIN_USER else tenant)


def verified_claims(secret: bytes, token: str, now: float | None = None) -> dict:
    """A valid token's claims (signature, audience, issuer, expiry); Unauthorized otherwise.
    Revocation is the store's to say (controlplane.tenancy.revocation.check)."""
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
    return claims


def check_password(state_dir: Path, username: str, password: str) -> str:
    """The role `username` signs in as (admin or viewer, the file-backed logins); Unauthorized
    for anything else."""
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


def route_template(request: Request) -> str:
    return getattr(request.scope.get("route"), "path", "")


def require_admin(request: Request, state: StateDep) -> str:
    """Route dependency enforcing the route's rule (controlplane.tenancy.route_rules): the
    caller's name; 401 without a valid token, 403 when the rule refuses the caller, 404 when an
    OWNED rule's object is not the caller's tenant's. A route with no rule is refused."""
    rule = route_rules.rule_for(request.method, route_template(request))
    if rule is None or rule.auth != route_rules.TOKEN_AUTH:
        raise Forbidden("this route has no access rule for user tokens (controlplane.tenancy.route_rules)",
                        code="no_rule")
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    claims = verified_claims(state.token_secret, bearer_from(request))
    principal = principal_of(claims)
    revocation.check(state.store, claims)  # a deleted user's tokens, a logged-out token
    refusal = route_rules.decide(rule, principal)
    if refusal is not None:
        raise Forbidden(refusal.message, code=refusal.code)
    if rule.tenant == route_rules.OWNED:
        owners.check_owned(state.store, principal, rule.kind, str(request.path_params.get(rule.param, "")),
                           write=rule.writes)
    request.state.principal = principal
    return principal.subject


def current_principal(request: Request, _: Annotated[str, Depends(require_admin)]) -> Principal:
    """Route parameter: the caller require_admin admitted (its tenant scopes lists and creates)."""
    return request.state.principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]


def password_principal(state, username: str, password: str) -> Principal:
    """Who a username and password sign in as: the file-backed admin or viewer, else a local
    user (controlplane.tenancy.users); Unauthorized "bad_credentials" for anything else."""
    if username in PASSWORD_FILES:
        return Principal(username, check_password(state.state_dir, username, password))
    principal = users.verify(state.store, username, password)
    if principal is None:
        raise Unauthorized("wrong username or password", code="bad_credentials")
    return principal


def token_for(state, principal: Principal) -> tuple[str, float]:
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    return issue_token(state.token_secret, principal.subject, state.settings.token_ttl_s,
                       role=principal.role, tenant=principal.tenant,
                       generation=revocation.generation(state.store, principal.subject))


def logout(state, token: str) -> None:
    """Revoke one valid token (its jti) until it would have expired; a bad token is ignored."""
    if state.token_secret is None:
        state.token_secret = ensure_token_secret(state.store)
    try:
        claims = verified_claims(state.token_secret, token)
    except Unauthorized:
        return
    revocation.revoke_token(state.store, str(claims.get("jti", "")), float(claims["exp"]))


async def checked_login(state, username: str, password: str, source: str | None) -> Principal:
    """password_principal through the login gate (controlplane.tenancy.login_gate): off the
    shared thread pool, 429 when too many logins wait or this account or address is backing off."""
    return await state.logins.check(username, source or "unknown",
                                    lambda: password_principal(state, username, password))


async def login_token(state, username: str, password: str, source: str | None = None) -> tuple[str, float, str]:
    """(token, expires_at, role) for a correct login: shared by the API and the console."""
    principal = await checked_login(state, username, password, source)
    token, expires_at = token_for(state, principal)
    return token, expires_at, principal.role


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    username: str
    password: str


class LoginResponse(BaseModel):
    token: str
    expires_at: float
    role: str = ADMIN_USER
    tenant: str | None = None


router = APIRouter(prefix="/api/auth", tags=["auth"])


@router.post("/login", response_model=LoginResponse, responses={429: {"description": "too many logins wait, or "
                                                                       "this account or address is backing off"}})
async def login(body: LoginRequest, request: Request, state: StateDep) -> LoginResponse:
    principal = await checked_login(state, body.username, body.password,
                                    request.client.host if request.client else None)
    token, expires_at = token_for(state, principal)
    return LoginResponse(token=token, expires_at=expires_at, role=principal.role, tenant=principal.tenant)


class OidcLoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id_token: str = Field(..., min_length=1, max_length=16384)


@router.post("/oidc", response_model=LoginResponse)
def login_oidc(body: OidcLoginRequest, request: Request, state: StateDep) -> LoginResponse:
    """Exchange the identity provider's ID token for a fabricd token (tenancy/oidc_login.py)."""
    principal = oidc_login.login_of(request.app.state, state.settings.login_oidc).verify(body.id_token)
    token, expires_at = token_for(state, principal)
    return LoginResponse(token=token, expires_at=expires_at, role=principal.role, tenant=principal.tenant)


@router.post("/logout", dependencies=[Depends(require_admin)])
def logout_route(request: Request, state: StateDep) -> dict:
    """Revoke the presented token (POST /api/auth/logout); later calls with it are 401."""
    logout(state, bearer_from(request))
    return {"revoked": True}


@router.get("/whoami", dependencies=[Depends(require_admin)])
def whoami(principal: PrincipalDep) -> dict:
    """The caller this token names: subject, role and tenant (none: cluster-wide)."""
    return {"subject": principal.subject, "role": principal.role, "tenant": principal.tenant}
