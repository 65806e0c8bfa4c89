"""POST /v1/responses (OpenAI's Responses API, which vLLM serves), minimally: text input (a
string, or messages whose content is a string or input_text parts) and instructions in, one
assistant message out, streamed or not.

A stream is the Responses API's typed events, each as ``event: TYPE`` plus ``data: {...}`` with
a ``sequence_number``: response.created, response.in_progress, output_item.added,
content_part.added, one response.output_text.delta per token, output_text.done,
content_part.done, output_item.done, and last response.completed (or response.incomplete when
max_output_tokens cut the answer), whose ``response.usage`` holds input_tokens,
output_tokens and total_tokens. There is no ``data: [DONE]`` (OpenAI sends none on this API).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from enginesim import openai_format as fmt
from enginesim.engine import Engine
from enginesim.generate_routes import check_common
from enginesim.generation_plan import GenerationPlan, PlanRejected, plan_generation
from enginesim.http_util import JsonBytes, bad_request, parse_openai


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict]
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    ignore_eos: bool = False

    def prompt_text(self) -> str:
        head = f"<|system|>{self.instructions}\n" if self.instructions else ""
        if isinstance(self.input, str):
            return head + f"<|user|>{self.input}\n"
        parts = []
        for item in self.input:
            content = item.get("content", "")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"<|{item.get('role', 'user')}|>{content}\n")
        return head + "".join(parts)


def _message(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status != "in_progress" else []}


def _response(rid: str, created: int, req: ResponsesRequest, status: str, output: list, use: dict | None) -> dict:
    return {
        "id": rid, "object": "response", "created_at": created, "model": req.model, "status": status,
        "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "metadata": {},
        "output": output, "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto",
        "tools": [], "usage": use,
    }


def _usage(plan: GenerationPlan) -> dict:
    return {"input_tokens": plan.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": plan.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": plan.prompt_tokens + plan.completion_tokens}


def _status(plan: GenerationPlan) -> str:
    return "incomplete" if plan.finish_reason == "length" else "completed"


async def _stream(engine: Engine, plan: GenerationPlan, arrived: float, req: ResponsesRequest) -> AsyncIterator[bytes]:
    rid, item_id, created = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", int(time.time())
    seq = 0

    def event(kind: str, **fields) -> bytes:
        nonlocal seq
        seq += 1
        return f"event: {kind}\n".encode() + fmt.sse({"type": kind, "sequence_number": seq - 1, **fields})

    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=_response(rid, created, req, "in_progress", [], None))
    yield event("response.in_progress", response=_response(rid, created, req, "in_progress", [], None))
    yield event("response.output_item.added", output_index=0, item=_message(item_id, "", "in_progress"))
    yield event("response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []})
    text = []
    async with aclosing(engine.run_sequence(plan, arrived)) as tokens:
        async for token in tokens:
            text.append(token)
            yield event("response.output_text.delta", **where, delta=token, logprobs=[])
    full = "".join(text)
    yield event("response.output_text.done", **where, text=full, logprobs=[])
    yield event("response.content_part.done", **where, part={"type": "output_text", "text": full, "annotations": []})
    item = _message(item_id, full, "completed")
    yield event("response.output_item.done", output_index=0, item=item)
    status = _status(plan)
    final = _response(rid, created, req, status, [item], _usage(plan))
    yield event("response.completed" if status == "completed" else "response.incomplete", response=final)


def make_responses_routes(engine: Engine) -> list[Route]:
    async def responses(request: Request) -> Response:
        arrived = time.monotonic()
        req = await parse_openai(request, ResponsesRequest)
        if isinstance(req, Response):
            return req
        refused = check_common(engine, req.model)
        if refused:
            return refused
        try:
            text = req.prompt_text()
            plan = engine.with_prefix_cache(plan_generation(engine.settings, text, req.max_output_tokens,
                                                            req.ignore_eos), text)
        except PlanRejected as err:
            return bad_request(err.message, "max_output_tokens" if err.param == "max_tokens" else err.param)
        if req.stream:
            return StreamingResponse(_stream(engine, plan, arrived, req), media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"})
        async with aclosing(engine.run_sequence(plan, arrived)) as tokens:
            full = "".join([t async for t in tokens])
        item = _message(f"msg_{uuid.uuid4().hex}", full, "completed")
        body = _response(f"resp_{uuid.uuid4().hex}", int(time.time()), req, _status(plan), [item], _usage(plan))
        return JsonBytes(fmt.to_json(body))

    return [Route("/v1/responses", responses, methods=["POST"])]
