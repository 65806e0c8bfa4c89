"""The agent's one error shape: FabricErrors, Starlette's own answers and validation failures all
render as {"error": {"code", "message"}}, and the OpenAPI lists them on every operation."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from common.errors import FabricError, InvalidInput
from common.http_allow import allow_headers
from common.openapi_errors import add_error_responses

AGENT_ERRORS = {"400": "a malformed request", "403": "the caller's certificate "
                "may not call this agent (only the control plane's)", "404": "no such GPU, VM or service",
                "409": "conflict with the node's current state", "422": "invalid input; the message names "
                "each field", "503": "the driver or dataplane is not available here"}


def add_error_handlers(app: FastAPI) -> None:
    """Every error the app answers, in the one shape."""

    @app.exception_handler(FabricError)
    async def _fabric_error(_req: Request, exc: FabricError):
        return JSONResponse(exc.to_body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # Starlette's own answers (a body that is not JSON, an unknown route, a wrong method) in
        # the one error shape, not {"detail": ...}: found by the schemathesis fuzz.
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        code = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = allow_headers(request, headers)
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=exc.status_code,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError):
        parts = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            parts.append(f"{where}: {err.get('msg', 'invalid')}")
        return JSONResponse(InvalidInput("; ".join(parts) or "invalid request").to_body(), status_code=422)


def document_errors(app: FastAPI) -> None:
    """Every operation of the agent's OpenAPI lists the errors it can answer, in the one shape."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            add_error_responses(build(), AGENT_ERRORS)
        return app.openapi_schema

    app.openapi = openapi
