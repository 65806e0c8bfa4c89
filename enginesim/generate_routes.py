"""POST /v1/chat/completions and /v1/completions, streaming (SSE) and not.

Usage in streams follows vLLM: a final chunk with empty `choices` and `usage` is
sent only when the client asks with stream_options.include_usage, and the last
token's chunk carries the finish reason (no empty chunk of its own). The first
streamed chunk is sent with the first token (after queue wait and prefill), so a
client measuring time to its first chunk measures TTFT.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from enginesim import openai_format as fmt
from enginesim.api_models import ChatCompletionRequest, CompletionRequest
from enginesim.engine import Engine
from enginesim.generation_plan import GenerationPlan, PlanRejected, continued, plan_generation
from enginesim.http_util import JsonBytes, bad_request, openai_error, parse_openai

_SSE_HEADERS = {"cache-control": "no-cache"}


def check_common(engine: Engine, model: str, n: int = 1) -> Response | None:
    """The refusals shared by every generate and pooling route, checked before any work."""
    if not engine.serves(model):
        return openai_error(404, f"The model `{model}` does not exist.", "NotFoundError", "model_not_found", "model")
    if n != 1:
        return bad_request("the simulator supports n=1 only", "n")
    if engine.draining:  # vLLM 0.32 after SIGTERM with --shutdown-timeout N: the scheduler is shut
        return openai_error(500, "cannot schedule new futures after shutdown", "InternalServerError", 500)
    if engine.should_fail():
        engine.metrics.observe_failed()
        return openai_error(500, "injected fault: the engine failed this request", "server_error", "injected_fault")
    return None


def _finish(plan: GenerationPlan, sent: int) -> str | None:
    return plan.finish_reason if sent == plan.completion_tokens else None


async def _chat_stream(
    engine: Engine, plan: GenerationPlan, arrived: float, include_usage: bool
) -> AsyncIterator[bytes]:
    rid, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), engine.settings.model
    sent = 0
    async with aclosing(engine.run_sequence(plan, arrived)) as tokens:
        async for token in tokens:
            if not sent:
                yield fmt.sse(fmt.chat_chunk(rid, created, model, {"role": "assistant", "content": ""}))
            sent += 1
            # As vLLM does, the last token's chunk carries the finish reason (no chunk of its own).
            yield fmt.sse(fmt.chat_chunk(rid, created, model, {"content": token}, _finish(plan, sent)))
    if sent < plan.completion_tokens or not sent:
        yield fmt.sse(fmt.chat_chunk(rid, created, model, {}, plan.finish_reason))
    if include_usage:
        use = fmt.usage(plan.prompt_tokens, plan.completion_tokens)
        yield fmt.sse(fmt.usage_chunk(rid, created, model, "chat.completion.chunk", use))
    yield fmt.SSE_DONE


async def _completion_stream(
    engine: Engine, plan: GenerationPlan, arrived: float, include_usage: bool, echo: str
) -> AsyncIterator[bytes]:
    rid, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), engine.settings.model
    sent = 0
    async with aclosing(engine.run_sequence(plan, arrived)) as tokens:
        async for token in tokens:
            text = echo + token if not sent else token
            sent += 1
            yield fmt.sse(fmt.completion_chunk(rid, created, model, text, _finish(plan, sent)))
    if sent < plan.completion_tokens or not sent:
        yield fmt.sse(fmt.completion_chunk(rid, created, model, "", plan.finish_reason))
    if include_usage:
        use = fmt.usage(plan.prompt_tokens, plan.completion_tokens)
        yield fmt.sse(fmt.usage_chunk(rid, created, model, "text_completion", use))
    yield fmt.SSE_DONE


async def _collect(engine: Engine, plan: GenerationPlan, arrived: float) -> str:
    async with aclosing(engine.run_sequence(plan, arrived)) as tokens:
        return "".join([t async for t in tokens])


def make_generate_routes(engine: Engine) -> list[Route]:
    async def chat(request: Request) -> Response:
        arrived = time.monotonic()
        req = await parse_openai(request, ChatCompletionRequest)
        if isinstance(req, Response):
            return req
        refused = check_common(engine, req.model, req.n)
        if refused:
            return refused
        try:
            text = req.prompt_text()
            prior = req.continued_from()
            seed_text, start = (continued(prior[0] + prior[1], prior[0]) or (text, 0)) if prior else (text, 0)
            plan = engine.with_prefix_cache(plan_generation(engine.settings, text, req.output_limit(), req.ignore_eos,
                                                            seed_text=seed_text, start=start), text)
        except PlanRejected as err:
            return bad_request(err.message, err.param)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _chat_stream(engine, plan, arrived, include_usage),
                media_type="text/event-stream", headers=_SSE_HEADERS,
            )
        text = await _collect(engine, plan, arrived)
        body = fmt.chat_completion(
            f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), req.model, text,
            plan.finish_reason, fmt.usage(plan.prompt_tokens, plan.completion_tokens),
        )
        return JsonBytes(fmt.to_json(body))

    async def completions(request: Request) -> Response:
        arrived = time.monotonic()
        req = await parse_openai(request, CompletionRequest)
        if isinstance(req, Response):
            return req
        try:
            prompt, prompt_tokens = req.single_prompt()
        except ValueError as err:
            return bad_request(str(err), "prompt")
        refused = check_common(engine, req.model, req.n)
        if refused:
            return refused
        try:
            seed_text, start = (continued(prompt) if prompt_tokens is None else None) or (prompt, 0)
            plan = engine.with_prefix_cache(plan_generation(engine.settings, prompt, req.max_tokens, req.ignore_eos,
                                                            prompt_tokens, seed_text, start), prompt)
        except PlanRejected as err:
            return bad_request(err.message, err.param)
        echo = prompt if req.echo else ""
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _completion_stream(engine, plan, arrived, include_usage, echo),
                media_type="text/event-stream", headers=_SSE_HEADERS,
            )
        text = echo + await _collect(engine, plan, arrived)
        body = fmt.completion(
            f"cmpl-{uuid.uuid4().hex}", int(time.time()), req.model, text,
            plan.finish_reason, fmt.usage(plan.prompt_tokens, plan.completion_tokens),
        )
        return JsonBytes(fmt.to_json(body))

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
