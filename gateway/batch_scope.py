"""A model-scoped key may create a batch only when every line of its input file names the key's
model: the scope is checked on what the batch will run, not on what the create call's body says
(a batch create body names no model at all).

The gateway reads the input file back from the upstream (GET /v1/files/{id}/content, the same
replica order as the call), streaming and capped at the upload limit, and checks each JSONL
line's ``body.model``. A line that is not JSON, or names another model or none, refuses the
batch with 403 naming the line.
"""

from __future__ import annotations

import re

from common.errors import Forbidden, InvalidInput, NotFound
from common.http1_client import UpstreamError, UpstreamPool
from gateway.proxy import UpstreamFailed, split_target
from gateway.request_body import BadJson, load_json

FILE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def check_line(line: bytes, number: int, model: str) -> None:
    """Pure: one JSONL line of a batch input file must run the key's model."""
    try:
        row = load_json(line, "application/json")
    except BadJson:
        raise Forbidden(f"line {number} of the batch input file is not JSON", code="model_not_allowed") from None
    body = row.get("body") if isinstance(row, dict) else None
    named = body.get("model") if isinstance(body, dict) else None
    if named != model:
        raise Forbidden(f"line {number} of the batch input file does not name model {model!r}, the only model "
                        "the API key allows", code="model_not_allowed")


async def check_batch(pool: UpstreamPool, targets: list[str], headers: list[tuple[bytes, bytes]],
                      data: dict | None, model: str, max_bytes: int) -> None:
    file_id = (data or {}).get("input_file_id")
    if not isinstance(file_id, str) or not FILE_ID.match(file_id):
        raise InvalidInput("input_file_id must name an uploaded file", code="invalid_input_file_id")
    if not targets:
        raise UpstreamFailed("the endpoint has no upstream to read the batch input file from")
    scheme, host, port = split_target(targets[0])
    keep = [(k, v) for k, v in headers if k == b"x-request-id"]
    try:
        resp = await pool.request(scheme, host, port, "GET", f"/v1/files/{file_id}/content".encode(), keep, b"")
    except UpstreamError:
        raise UpstreamFailed("could not read the batch input file from the upstream") from None
    try:
        if resp.status == 404:
            raise NotFound(f"input file {file_id!r} does not exist", code="input_file_not_found")
        if resp.status != 200:
            raise UpstreamFailed(f"reading the batch input file answered {resp.status}")
        tail, number, total = b"", 0, 0
        while (chunk := await resp.next_chunk()) is not None:
            total += len(chunk)
            if total > max_bytes:
                raise Forbidden("the batch input file is larger than the upload limit", code="model_not_allowed")
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                number += 1
                if line.strip():
                    check_line(line, number, model)
        if tail.strip():
            check_line(tail, number + 1, model)
    except UpstreamError:
        raise UpstreamFailed("the upstream broke while sending the batch input file") from None
    finally:
        resp.close()

