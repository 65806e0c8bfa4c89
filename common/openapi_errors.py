"""The one error shape in an OpenAPI document: every operation lists the error answers it can
give, each {"error": {"code", "message"}} (a 422 may also carry "fields"). Used by fabricd
(controlplane.openapi_doc) and the agent (agent.api), so a client or a fuzzer that reads either
document knows every answer it can get."""

from __future__ import annotations

ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
        "code": {"type": "string"}, "message": {"type": "string"},
        "fields": {"type": "array", "items": {"type": "object"}}}}},
}


def add_error_responses(doc: dict, errors: dict[str, str]) -> None:
    """Add each status of ``errors`` (status -> why) to every operation, in the error shape; an
    operation's own documented answer for a status is kept, except 422 (FastAPI's default
    validation shape, which is not what the error handlers send)."""
    doc.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for ops in doc.get("paths", {}).values():
        for op in ops.values():
            responses = op.setdefault("responses", {})
            for status, why in errors.items():
                if status == "422" or status not in responses:
                    responses[status] = {"description": why, **ref}
    schemas = doc["components"]["schemas"]
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
