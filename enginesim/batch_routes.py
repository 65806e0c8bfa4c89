"""OpenAI Files + Batches, the subset the official `openai` client uses.

    POST   /v1/files                  multipart upload (purpose "batch", JSONL), kept in memory
    GET    /v1/files                  list (newest first; purpose, limit, after, order)
    GET    /v1/files/{id}             the file object
    GET    /v1/files/{id}/content     the bytes
    DELETE /v1/files/{id}             frees the memory
    POST   /v1/batches                {input_file_id, endpoint, completion_window: "24h", metadata?}
    GET    /v1/batches                list (newest first; limit, after)
    GET    /v1/batches/{id}
    POST   /v1/batches/{id}/cancel

A batch runs in the background: validating (every line checked: custom_id unique, method
POST, url = the batch's endpoint, body an object, no streaming) -> in_progress -> finalizing
-> completed, or failed (validation; the reasons in `errors`), or cancelling -> cancelled
(lines still running are stopped, finished ones are kept). Each line goes through the
engine's own route handlers in-process (same validation, error-rate fault, queue, scheduler
and vLLM metrics as an HTTP request), at most 2 x --max-num-seqs lines at a time, so a batch
fills the running slots and shows a waiting queue. Lines answered 2xx go to the output file,
the others to the error file, both in OpenAI's batch output format:

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"},
     "error": null}

Nothing survives a restart. Uploads are refused (413) above MAX_FILE_BYTES per file or when
all stored files together exceed MAX_STORED_BYTES; output files are always stored.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from enginesim import openai_format as fmt
from enginesim.engine import Engine
from enginesim.generate_routes import make_generate_routes
from enginesim.http_util import JsonBytes, bad_request, openai_error, parse_openai
from enginesim.multipart import parse_multipart
from enginesim.pooling_routes import make_pooling_routes

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_STORED_BYTES = 256 * 1024 * 1024
MAX_BATCH_LINES = 50_000
MAX_REPORTED_ERRORS = 20
BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
COMPLETION_WINDOW = "24h"
WINDOW_S = 24 * 3600
# Multipart framing (boundaries, part headers) on top of the file itself.
_MULTIPART_SLACK = 64 * 1024


def _now() -> int:
    return int(time.time())


def not_found(what: str, ident: str, param: str | None = None) -> Response:
    return openai_error(404, f"No {what} with id `{ident}`.", "invalid_request_error", "not_found", param)


# ---- files -----------------------------------------------------------------------------------

@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int = field(default_factory=_now)

    def to_obj(self) -> dict:
        return {
            "id": self.id, "object": "file", "bytes": len(self.data), "created_at": self.created_at,
            "filename": self.filename, "purpose": self.purpose, "status": "processed",
            "status_details": None, "expires_at": None,
        }


class BadJsonl(ValueError):
    pass


def parse_jsonl(data: bytes) -> list[dict]:
    """Every non-blank line as a JSON object, or BadJsonl naming the first bad line (1-based)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BadJsonl(f"line {line} is not valid UTF-8") from None
    out = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise BadJsonl(f"line {number} is not valid JSON: {err}") from None
        if not isinstance(obj, dict):
            raise BadJsonl(f"line {number} is not a JSON object")
        out.append(obj)
    return out


# ---- batches ---------------------------------------------------------------------------------

class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="allow")
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


@dataclass
class BatchJob:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    model: str
    input_data: bytes
    created_at: int = field(default_factory=_now)
    status: str = "validating"
    errors: list[dict] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    def to_obj(self) -> dict:
        # No "usage": a gateway in front reads `usage` from responses to charge tokens, and a
        # batch object is polled many times.
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "model": self.model,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "in_progress_at": self.in_progress_at,
            "expires_at": self.created_at + WINDOW_S, "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at, "failed_at": self.failed_at, "expired_at": None,
            "cancelling_at": self.cancelling_at, "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        }


def validate_lines(lines: list[dict], endpoint: str) -> list[dict]:
    """OpenAI-style batch errors ({code, message, param, line}); empty when every line is runnable."""
    errors: list[dict] = []
    seen: set[str] = set()

    def err(line: int, param: str | None, message: str) -> None:
        errors.append({"code": "invalid_request", "message": message, "param": param, "line": line})

    if not lines:
        err(1, None, "the input file has no requests")
    if len(lines) > MAX_BATCH_LINES:
        err(MAX_BATCH_LINES + 1, None, f"a batch holds at most {MAX_BATCH_LINES} requests")
    for number, line in enumerate(lines, start=1):
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
        cid = line.get("custom_id")
        if not isinstance(cid, str) or not cid:
            err(number, "custom_id", "custom_id must be a non-empty string")
        elif cid in seen:
            err(number, "custom_id", f"custom_id `{cid}` is used by an earlier line")
        else:
            seen.add(cid)
        if line.get("method") != "POST":
            err(number, "method", "method must be POST")
        if line.get("url") != endpoint:
            err(number, "url", f"url must be the batch's endpoint {endpoint}, got {line.get('url')!r}")
        body = line.get("body")
        if not isinstance(body, dict):
            err(number, "body", "body must be a JSON object")
        elif body.get("stream") is True:
            err(number, "body.stream", "streaming requests cannot be batched")
    return errors[:MAX_REPORTED_ERRORS]


class _Done:
    """receive() for an in-process call: the body once, then a disconnect once the response ended."""

    def __init__(self, body: bytes):
        self.body: bytes | None = body
        self.ended = asyncio.Event()

    async def __call__(self) -> dict:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.ended.wait()
        return {"type": "http.disconnect"}


async def call_inprocess(app: Starlette, path: str, body: bytes, request_id: str) -> tuple[int, bytes]:
    """POST `body` to `path` on an ASGI app in this process: (status, response body)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", request_id.encode())],
    }
    receive = _Done(body)
    status = 500
    parts: list[bytes] = []

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                receive.ended.set()

    try:
        await app(scope, receive, send)
    finally:
        receive.ended.set()
    return status, b"".join(parts)


class BatchService:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, BatchJob] = {}
        self.stored_bytes = 0
        self.concurrency = 2 * engine.settings.max_num_seqs
        # The engine's own generate/pooling handlers, bound to the same Engine: a batch line
        # shares the scheduler, faults and metrics with HTTP traffic.
        self.inner = Starlette(routes=[*make_generate_routes(engine), *make_pooling_routes(engine)])

    def add_file(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        f = StoredFile(id=f"file-{uuid.uuid4().hex[:24]}", filename=filename, purpose=purpose, data=data)
        self.files[f.id] = f
        self.stored_bytes += len(data)
        return f

    def delete_file(self, file_id: str) -> bool:
        f = self.files.pop(file_id, None)
        if f is None:
            return False
        self.stored_bytes -= len(f.data)
        return True

    def start(self, job: BatchJob) -> None:
        self.batches[job.id] = job
        job.task = asyncio.get_running_loop().create_task(self._run(job))

    async def _run(self, job: BatchJob) -> None:
        try:
            lines = parse_jsonl(job.input_data)
        except BadJsonl as err:  # only if the file was stored unchecked; uploads are checked
            lines, job.errors = [], [{"code": "invalid_jsonl", "message": str(err), "param": None, "line": None}]
        else:
            job.errors = validate_lines(lines, job.endpoint) or None
        job.input_data = b""
        if job.errors:
            job.status, job.failed_at = "failed", _now()
            return
        if job.cancel_requested.is_set():
            self._finish_cancelled(job, [])
            return
        job.total, job.status, job.in_progress_at = len(lines), "in_progress", _now()
        results: list[tuple[bool, dict] | None] = [None] * len(lines)
        todo = iter(enumerate(lines))

        async def worker() -> None:
            for index, line in todo:  # one shared iterator: each line is taken once
                ok, out = await self._one(job, line)
                results[index] = (ok, out)
                if ok:
                    job.completed += 1
                else:
                    job.failed += 1

        workers = [asyncio.ensure_future(worker()) for _ in range(min(self.concurrency, len(lines)))]
        everything = asyncio.gather(*workers)
        cancel_wait = asyncio.ensure_future(job.cancel_requested.wait())
        try:
            await asyncio.wait([everything, cancel_wait], return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancel_wait.cancel()
            # A cancelled line frees its slot (or its queue place) at once; the scheduler copes with
            # running and queued sequences cancelled in the same tick (test_engine_sim_cancel).
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, everything, return_exceptions=True)
        finished = [r for r in results if r is not None]
        if job.cancel_requested.is_set() and len(finished) < len(lines):
            self._finish_cancelled(job, finished)
            return
        job.status, job.finalizing_at = "finalizing", _now()
        self._write_outputs(job, finished)
        job.status, job.completed_at = "completed", _now()

    async def _one(self, job: BatchJob, line: dict) -> tuple[bool, dict]:
        request_id = f"req_{uuid.uuid4().hex}"
        out = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line["custom_id"], "response": None,
               "error": None}
        try:
            status, raw = await call_inprocess(self.inner, job.endpoint, fmt.to_json(line["body"]), request_id)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a bug in a handler must not lose the rest of the batch
            out["error"] = {"code": "internal_error", "message": f"{type(err).__name__}: {err}"}
            return False, out
        out["response"] = {"status_code": status, "request_id": request_id, "body": body}
        return 200 <= status < 300, out

    def _write_outputs(self, job: BatchJob, finished: list[tuple[bool, dict]]) -> None:
        good = [out for ok, out in finished if ok]
        bad = [out for ok, out in finished if not ok]
        if good:
            job.output_file_id = self._store_jsonl(f"{job.id}_output.jsonl", good).id
        if bad:
            job.error_file_id = self._store_jsonl(f"{job.id}_error.jsonl", bad).id

    def _store_jsonl(self, filename: str, rows: list[dict]) -> StoredFile:
        data = b"".join(fmt.to_json(r) + b"\n" for r in rows)
        return self.add_file(filename, "batch_output", data)

    def _finish_cancelled(self, job: BatchJob, finished: list[tuple[bool, dict]]) -> None:
        self._write_outputs(job, finished)
        job.status, job.cancelled_at = "cancelled", _now()


def _page(items: list[dict], request: Request, default_limit: int, max_limit: int) -> Response:
    try:
        limit = int(request.query_params.get("limit", default_limit))
    except ValueError:
        return bad_request("limit must be an integer", "limit")
    if not 1 <= limit <= max_limit:
        return bad_request(f"limit must be within 1..{max_limit}", "limit")
    after = request.query_params.get("after")
    if after:
        ids = [i["id"] for i in items]
        if after not in ids:
            return bad_request(f"after: no object with id `{after}`", "after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    body = {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
    return JsonBytes(fmt.to_json(body))


def make_batch_routes(engine: Engine) -> list[Route]:
    svc = BatchService(engine)

    async def upload(request: Request) -> Response:
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_FILE_BYTES + _MULTIPART_SLACK:
                return openai_error(413, f"the file is larger than {MAX_FILE_BYTES} bytes",
                                    "invalid_request_error", "file_too_large", "file")
        try:
            fields = parse_multipart(bytes(raw), request.headers.get("content-type", ""))
        except ValueError as err:
            return bad_request(str(err), "file")
        purpose = fields.get("purpose", (None, b""))[1].decode("utf-8", "replace").strip()
        if not purpose:
            return bad_request("purpose is required", "purpose")
        if purpose != "batch":
            return bad_request(f"purpose `{purpose}` is not supported; the engine keeps batch input files only",
                               "purpose")
        if "file" not in fields or fields["file"][0] is None:
            return bad_request("file is required (a multipart file part named `file`)", "file")
        filename, data = fields["file"]
        if len(data) > MAX_FILE_BYTES:
            return openai_error(413, f"the file is larger than {MAX_FILE_BYTES} bytes",
                                "invalid_request_error", "file_too_large", "file")
        if svc.stored_bytes + len(data) > MAX_STORED_BYTES:
            return openai_error(413, f"the engine already holds {svc.stored_bytes} bytes of files "
                                f"(limit {MAX_STORED_BYTES}); delete some first",
                                "invalid_request_error", "storage_full", "file")
        try:
            parse_jsonl(data)
        except BadJsonl as err:
            return bad_request(f"invalid JSONL in {filename or 'the file'}: {err}", "file")
        return JsonBytes(fmt.to_json(svc.add_file(filename or "upload.jsonl", purpose, data).to_obj()))

    async def list_files(request: Request) -> Response:
        purpose = request.query_params.get("purpose")
        items = [f.to_obj() for f in svc.files.values() if not purpose or f.purpose == purpose]
        if request.query_params.get("order", "desc") != "asc":
            items.reverse()
        return _page(items, request, 10000, 10000)

    async def get_file(request: Request) -> Response:
        f = svc.files.get(request.path_params["file_id"])
        if f is None:
            return not_found("file", request.path_params["file_id"])
        return JsonBytes(fmt.to_json(f.to_obj()))

    async def file_content(request: Request) -> Response:
        f = svc.files.get(request.path_params["file_id"])
        if f is None:
            return not_found("file", request.path_params["file_id"])
        return Response(f.data, media_type="application/octet-stream")

    async def delete_file(request: Request) -> Response:
        file_id = request.path_params["file_id"]
        if not svc.delete_file(file_id):
            return not_found("file", file_id)
        return JsonBytes(fmt.to_json({"id": file_id, "object": "file", "deleted": True}))

    async def create_batch(request: Request) -> Response:
        req = await parse_openai(request, BatchCreate)
        if isinstance(req, Response):
            return req
        if req.endpoint not in BATCH_ENDPOINTS:
            return bad_request(f"endpoint `{req.endpoint}` cannot be batched here; use one of "
                               f"{', '.join(BATCH_ENDPOINTS)}", "endpoint")
        if req.completion_window != COMPLETION_WINDOW:
            return bad_request(f"completion_window must be {COMPLETION_WINDOW!r}", "completion_window")
        f = svc.files.get(req.input_file_id)
        if f is None:
            return not_found("file", req.input_file_id, "input_file_id")
        if f.purpose != "batch":
            return bad_request(f"file `{f.id}` has purpose `{f.purpose}`, not `batch`", "input_file_id")
        job = BatchJob(id=f"batch_{uuid.uuid4().hex}", endpoint=req.endpoint, input_file_id=f.id,
                       completion_window=req.completion_window, metadata=req.metadata,
                       model=engine.settings.model, input_data=f.data)
        svc.start(job)
        return JsonBytes(fmt.to_json(job.to_obj()))

    async def list_batches(request: Request) -> Response:
        return _page([b.to_obj() for b in reversed(svc.batches.values())], request, 20, 100)

    async def get_batch(request: Request) -> Response:
        job = svc.batches.get(request.path_params["batch_id"])
        if job is None:
            return not_found("batch", request.path_params["batch_id"])
        return JsonBytes(fmt.to_json(job.to_obj()))

    async def cancel_batch(request: Request) -> Response:
        job = svc.batches.get(request.path_params["batch_id"])
        if job is None:
            return not_found("batch", request.path_params["batch_id"])
        if job.status in ("completed", "failed", "expired"):
            return openai_error(409, f"a batch with status `{job.status}` cannot be cancelled",
                                "invalid_request_error", "invalid_state")
        if job.status not in ("cancelling", "cancelled"):
            job.status, job.cancelling_at = "cancelling", _now()
            job.cancel_requested.set()
        return JsonBytes(fmt.to_json(job.to_obj()))

    routes = [
        Route("/v1/files", upload, methods=["POST"]),
        Route("/v1/files", list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", get_file, methods=["GET"]),
        Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
        Route("/v1/batches", create_batch, methods=["POST"]),
        Route("/v1/batches", list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
    ]
    return routes
