"""fabricd's OpenAPI document, completed after FastAPI builds it (`install(app)`):

  - every operation lists the error answers it can give, all in the one error shape
    ({"error": {"code", "message"}}; a 422 also carries "fields"): 400, 401, 403, 404, 409, 413,
    422, 500 (an operation's own documented answers are kept);
  - a bearer security scheme ("bearer", the token from POST /api/auth/login), required by every
    /api/ operation whose rule (controlplane.tenancy.route_rules) takes a user token: not the
    login, the node routes (a node presents its cluster certificate: mutual TLS, which OpenAPI
    3.0 cannot express beside bearer; docs/api.md says so) nor routes checking their own secret;
  - links from each create (POST /api/ai/X) to the operations on what it made (/api/ai/X/{id}...),
    the path parameter taken from the created object's id or the request's name, so a client (or
    a stateful fuzzer such as schemathesis) can follow create -> read -> change -> delete.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from common.openapi_errors import add_error_responses
from controlplane.tenancy.route_rules import TOKEN_AUTH, rule_for

ERRORS = {"400": "the body is not JSON", "401": "no or bad token", "403": "not allowed (viewer, or a node "
          "acting for another)", "404": "no such object or route", "409": "conflict with the current state",
          "413": "the body is over FABRIC_MAX_BODY_BYTES", "422": "invalid input; the message names each field",
          "500": "a bug (logged)"}


def install(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        add_error_responses(doc, ERRORS)
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}
        for path, ops in doc.get("paths", {}).items():
            for method, op in ops.items():
                rule = rule_for(method.upper(), path)
                if path.startswith("/api/") and (rule is None or rule.auth == TOKEN_AUTH):
                    op["security"] = [{"bearer": []}]
        add_links(doc)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi


def _body_schema(doc: dict, op: dict, where: str) -> dict:
    if where == "request":
        content = op.get("requestBody", {}).get("content", {})
    else:
        content = next((r.get("content", {}) for s, r in op.get("responses", {}).items() if s.startswith("2")), {})
    schema = content.get("application/json", {}).get("schema", {})
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        schema = doc.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[1], {})
    return schema.get("properties", {})


def _created_id(doc: dict, op: dict) -> str | None:
    """The runtime expression naming what a create made: the response's id when it has one (keys,
    batches), else the name (or id) the request chose."""
    if "id" in _body_schema(doc, op, "response"):
        return "$response.body#/id"
    request = _body_schema(doc, op, "request")
    for field in ("name", "id"):
        if field in request:
            return f"$request.body#/{field}"
    return None


def add_links(doc: dict) -> None:
    """OpenAPI links from every create to the operations below it (see the module docstring)."""
    paths = doc.get("paths", {})
    for collection, ops in paths.items():
        create = ops.get("post")
        if create is None or "{" in collection or not collection.startswith("/api/ai/"):
            continue
        expression = _created_id(doc, create)
        if expression is None:
            continue
        links = {}
        for path, below in paths.items():
            if not path.startswith(collection + "/{"):
                continue
            param = path[len(collection) + 2:].split("}", 1)[0]
            for method, op in below.items():
                name = f"{method.upper()} {path}"
                links[name] = {"operationId": op["operationId"], "parameters": {param: expression},
                               "description": f"{name} on the object this call created"}
        if not links:
            continue
        for status, response in create.get("responses", {}).items():
            if status.startswith("2"):
                response["links"] = links
