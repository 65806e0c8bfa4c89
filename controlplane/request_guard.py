"""Three refusals before any route runs, as one ASGI middleware (`RequestGuard`):

  - a call to /api/ (other than the login) without credentials, or with a bearer token that does
    not verify: 401, before the body is read, so nobody unauthenticated learns how bodies are
    parsed or validated (a malformed body used to answer 400, an invalid one 422, before the
    route's own 401). Credentials are a bearer token or a cluster client certificate (a node;
    its route checks which node), or, in the insecure lab mode only (plain HTTP, loopback), a
    node naming itself on a node route. Routes the table (controlplane.tenancy.route_rules)
    calls PUBLIC check their own secret, or none, and pass. Roles (403) stay with the routes;
  - a body over `max_body_bytes` (FABRIC_MAX_BODY_BYTES, default 1 MiB): 413 "payload_too_large",
    from Content-Length before reading, or as soon as a chunked body passes the limit;
  - a body sent with ``Content-Encoding: gzip`` (an agent's observation report) is decompressed
    here, under the same limit on what it decompresses to (413: a small body that inflates past
    it is refused as soon as it does, never held whole), and reaches the route as plain JSON;
    gzip that does not decode, or more than one Content-Encoding header, is 400
    "invalid_encoding", any other encoding 415 "unsupported_encoding";
  - a JSON body holding a lone UTF-16 surrogate ("\\ud800"): Python decodes it into a str no
    store can encode, so it is refused as 422 "invalid" naming the field (`body.license`).
    Only a body whose bytes contain a \\ud8xx-\\udfxx escape is parsed a second time.

A model blob upload (PUT /api/ai/models/{name}/blobs/{digest}) is not buffered: it streams to
disk under its own limit and token (controlplane.api.model_blobs).
Everything else passes through untouched, with the (already read) body replayed to the app.
"""

from __future__ import annotations

import json
import re

from common.errors import Unauthorized
from common.gzip_bounded import GzipInvalid, GzipTooLarge, gunzip_bounded
from common.peer_cert import scope_client_cn
from controlplane.api.model_blobs import BLOB_PATH
from controlplane.auth import verify_claims
from controlplane.errors_http import error_body
from controlplane.node_identity import NODE_CERT_REQUIRED
from controlplane.settings import DEFAULT_MAX_BODY_BYTES
from controlplane.state import AppState
from controlplane.tenancy.route_rules import NODE_AUTH, PUBLIC_AUTH, RULES


def _routes(auth: str) -> list[tuple[str, re.Pattern]]:
    """(method, path pattern) of every route whose rule authenticates with ``auth``. A parameter
    matches anything, slashes included (a decoded %2F): such a path reaches the router, whose
    404 says more than a 401 would, and the route checks its own credentials anyway."""
    return [(method, re.compile("^" + re.sub(r"\\\{\w+(?::\w+)?\\\}", ".+", re.escape(path)) + "/?$"))
            for (method, path), rule in RULES.items() if rule.auth == auth]


PUBLIC_ROUTES = _routes(PUBLIC_AUTH)  # no user token: login, health, routes that check their own secret
NODE_ROUTES = _routes(NODE_AUTH)  # a node acts as itself (controlplane.node_identity)


def _matches(routes: list[tuple[str, re.Pattern]], method: str, path: str) -> bool:
    method = "GET" if method == "HEAD" else method
    return any(m == method and pattern.match(path) for m, pattern in routes)

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE = re.compile(r"[\ud800-\udfff]")


def surrogate_path(value, path: tuple = ("body",)) -> str | None:
    """Dotted location of the first string (or key) holding a lone surrogate, else None."""
    if isinstance(value, str):
        return ".".join(str(p) for p in path) if _LONE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _LONE.search(key):
                return ".".join(str(p) for p in (*path, "(key)"))
            found = surrogate_path(item, (*path, key))
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = surrogate_path(item, (*path, i))
            if found:
                return found
    return None


def credential_refusal(scope, secret: bytes | None, insecure: bool) -> tuple[str, str] | None:
    """(code, message) of the 401 for a call that shows no valid credentials, else None."""
    path, method = scope.get("path", ""), scope.get("method", "")
    if not path.startswith("/api/") or _matches(PUBLIC_ROUTES, method, path):
        return None
    header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
    kind, _, token = header.partition(" ")
    if kind.lower() == "bearer" and token.strip():
        if secret is None:
            return None  # not loaded yet: the route's own check answers
        try:
            verify_claims(secret, token.strip())
        except Unauthorized as exc:
            return exc.code, exc.message
        return None
    if scope_client_cn(scope) is not None:
        return None
    if _matches(NODE_ROUTES, method, path):
        if insecure and scope.get("scheme") == "http":
            return None  # the lab's all-in-one mode: controlplane.node_identity decides
        return "no_node_certificate", NODE_CERT_REQUIRED
    return "no_token", "missing bearer token; log in with POST /api/auth/login"


class RequestGuard:
    def __init__(self, app, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, state: AppState | None = None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.state is not None:
            refusal = credential_refusal(scope, self.state.token_secret, self.state.settings.insecure)
            if refusal is not None:
                return await self._refuse(send, 401, *refusal, extra=[(b"www-authenticate", b"Bearer")])
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        if scope["method"] == "PUT" and BLOB_PATH.match(scope.get("path", "")):
            # Model blobs stream to disk under their own limit (controlplane.api.model_blobs).
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return await self._refuse(send, 413, "payload_too_large", self._too_large())
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return await self._refuse(send, 413, "payload_too_large", self._too_large())
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        encodings = [v.strip().lower() for k, v in scope.get("headers") or () if k == b"content-encoding"]
        if len(encodings) > 1:  # which one counts would be a guess another reader might not share
            return await self._refuse(send, 400, "invalid_encoding",
                                      "the request carries more than one Content-Encoding header; send one")
        encoding = encodings[0] if encodings else b""
        if encoding == b"gzip":
            try:
                body = gunzip_bounded(body, self.max_body_bytes)
            except GzipTooLarge as exc:
                return await self._refuse(send, 413, "payload_too_large",
                                          f"the request body {exc} (FABRIC_MAX_BODY_BYTES); send less")
            except GzipInvalid as exc:
                return await self._refuse(send, 400, "invalid_encoding",
                                          f"the request body is {exc} (Content-Encoding: gzip)")
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"]
                                          if k not in (b"content-encoding", b"content-length")]
                     + [(b"content-length", str(len(body)).encode())]}
        elif encoding not in (b"", b"identity"):
            return await self._refuse(send, 415, "unsupported_encoding",
                                      "the request body's Content-Encoding is not gzip or identity; send one of those")
        if _SURROGATE_ESCAPE.search(body):
            where = _lone_surrogate(body)
            if where:
                return await self._refuse(send, 422, "invalid", f"{where}: a lone UTF-16 surrogate is not text; "
                                          "send valid Unicode")
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return (f"the request body is over {self.max_body_bytes} bytes (FABRIC_MAX_BODY_BYTES); "
                "send less, or page through the list")

    @staticmethod
    async def _refuse(send, status: int, code: str, message: str, extra: list | None = None) -> None:
        payload = json.dumps(error_body(code, message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close"), *(extra or [])]})
        await send({"type": "http.response.body", "body": payload})


def _lone_surrogate(body: bytes) -> str | None:
    try:
        return surrogate_path(json.loads(body))
    except ValueError:
        return None  # not JSON: the route's own parsing answers 400
