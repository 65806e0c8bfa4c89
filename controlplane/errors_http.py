"""Exception handlers: every error leaves fabricd as {"error": {"code", "message"}}.

  FabricError (common.errors)        its own status and code
  RequestValidationError (pydantic)  422 "invalid", the message names each bad field by location,
                                     e.g. "body.gpu.count: Input should be less than or equal to 8",
                                     and "fields" lists them ({field, message, type, ctx}; ctx holds the
                                     schema's limits, never the input) so fabricctl can name its flags;
                                     a body that is not JSON at all is 400 "bad_request" (what
                                     OpenAI-style clients expect)
  Starlette HTTPException            its status (unknown route 404, wrong method 405)
  anything else                      500 "internal" with no detail (it is a bug; the log has it)
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import Contended, FabricError, LimitExceeded, Unauthorized
from common.http_allow import allow_headers

log = logging.getLogger("fabricd.errors")

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "payload_too_large", 422: "invalid"}


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def validation_message(errors: list[dict]) -> str:
    """One line per pydantic error: dotted location, then pydantic's message without its prefix."""
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid"))
        for prefix in ("Value error, ", "Assertion failed, "):
            msg = msg.removeprefix(prefix)
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


async def _fabric_error(request: Request, exc: FabricError) -> JSONResponse:
    headers = {}
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, (LimitExceeded, Contended)):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    return JSONResponse(exc.to_body(), status_code=exc.status, headers=headers)


def validation_fields(errors: list[dict]) -> list[dict]:
    """The bad fields without the "body" prefix, with pydantic's type and the schema limits."""
    out = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] == "body":
            loc = loc[1:]
        ctx = {k: v for k, v in (err.get("ctx") or {}).items() if isinstance(v, (int, float, str))}
        out.append({"field": ".".join(loc), "message": str(err.get("msg", "invalid")).removeprefix("Value error, "),
                    "type": str(err.get("type", "")), "ctx": ctx})
    return out


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    bad_json = [e for e in errors if e.get("type") == "json_invalid"]
    if bad_json:
        detail = (bad_json[0].get("ctx") or {}).get("error", "")
        return JSONResponse(error_body("bad_request", f"the request body is not valid JSON{': ' + str(detail) if detail else ''}"),
                            status_code=400)
    body = error_body("invalid", validation_message(errors))
    body["error"]["fields"] = validation_fields(errors)
    return JSONResponse(body, status_code=422)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _HTTP_CODES.get(exc.status_code, "error")
    message = exc.detail if isinstance(exc.detail, str) else code
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    headers = getattr(exc, "headers", None)
    if exc.status_code == 405:
        headers = allow_headers(request, headers)
    return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=headers)


def internal_error(request: Request, exc: Exception) -> JSONResponse:
    """The 500 for a bug, logged once with its traceback (the app's middleware calls this)."""
    # Log the type and route only: exception text could echo request content.
    log.error("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body("internal", "internal error"), status_code=500)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    return internal_error(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FabricError, _fabric_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
