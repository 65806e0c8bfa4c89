"""fabricd's OpenAPI document, completed after FastAPI builds it (`install(app)`):

  - every operation lists the error answers it can give, all in the one error shape
    ({"error": {"code", "message"}}; a 422 also carries "fields"): 400, 401, 403, 404, 409, 413,
    422, 500 (an operation's own documented answers are kept);
  - a bearer security scheme ("bearer", the token from POST /api/auth/login), required by every
    /api/ operation except the login itself; nodes may instead present their cluster certificate
    (mutual TLS, which OpenAPI 3.0 cannot express beside bearer; docs/api.md says so).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"},
        "fields": {"type": "array", "items": {"type": "object"}}}}},
}
ERRORS = {"400": "the body is not JSON", "401": "no or bad token", "403": "not allowed (viewer, or a node "
          "acting for another)", "404": "no such object or route", "409": "conflict with the current state",
          "413": "the body is over FABRIC_MAX_BODY_BYTES", "422": "invalid input; the message names each field",
          "500": "a bug (logged)"}
PUBLIC = {"/api/auth/login"}


def install(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = doc.setdefault("components", {})
        components.setdefault("schemas", {})["Error"] = ERROR_SCHEMA
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}
        ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for path, ops in doc.get("paths", {}).items():
            for op in ops.values():
                responses = op.setdefault("responses", {})
                for status, why in ERRORS.items():
                    if status == "422" or status not in responses:
                        responses[status] = {"description": why, **ref}
                if path.startswith("/api/") and path not in PUBLIC:
                    op["security"] = [{"bearer": []}]
        schemas = components["schemas"]
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi
