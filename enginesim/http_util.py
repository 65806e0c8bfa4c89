"""Small HTTP helpers shared by the route modules: body parsing and error replies."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from common.errors import FabricError, InvalidInput
from enginesim.openai_format import error_body, to_json

M = TypeVar("M", bound=BaseModel)


class JsonBytes(Response):
    media_type = "application/json"


def openai_error(status: int, message: str, err_type: str, code: str | int, param: str | None = None) -> Response:
    return JsonBytes(to_json(error_body(message, err_type, code, param)), status_code=status)


def bad_request(message: str, param: str | None = None) -> Response:
    return openai_error(400, message, "invalid_request_error", "invalid_request", param)


def fabric_error(err: FabricError) -> Response:
    # Shape for the /sim control routes, which are Fabric's own API.
    return JsonBytes(to_json(err.to_body()), status_code=err.status)


def describe_validation(err: ValidationError) -> tuple[str, str | None]:
    """'messages: Field required' for the first problem, plus the field path."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return (f"{where}: {first['msg']}" if where else first["msg"]), (where or None)


async def read_json(request: Request) -> object:
    """Parsed body, or raises ValueError naming the problem."""
    raw = await request.body()
    if not raw:
        raise ValueError("request body is empty; expected a JSON object")
    try:
        return json.loads(raw)
    except ValueError:
        raise ValueError("request body is not valid JSON") from None


async def parse_openai(request: Request, model_cls: type[M]) -> M | Response:
    """The validated body, or a 400 in OpenAI's error shape that names the field."""
    try:
        return model_cls.model_validate(await read_json(request))
    except ValidationError as err:
        message, param = describe_validation(err)
        return bad_request(message, param)
    except ValueError as err:
        return bad_request(str(err))


async def parse_control(request: Request, model_cls: type[M]) -> M | Response:
    try:
        return model_cls.model_validate(await read_json(request))
    except ValidationError as err:
        return fabric_error(InvalidInput(describe_validation(err)[0]))
    except ValueError as err:
        return fabric_error(InvalidInput(str(err)))
