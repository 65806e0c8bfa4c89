"""FABRIC_DRY_RUN=1: after authentication, answer with a synthetic completion and touch no
upstream (two SSE chunks when the body asked to stream), so clients and keys can be tested
before any GPU exists."""

from __future__ import annotations

import json
import time
import uuid

from gateway.request_body import BodyInfo

TEXT = "dry run: no inference was performed"


async def respond(send, info: BodyInfo, endpoint: str) -> tuple[int, int]:
    cid, now, model = f"chatcmpl-dry-{uuid.uuid4().hex[:12]}", int(time.time()), info.model or endpoint
    usage = {"prompt_tokens": (info.prompt_chars + 3) // 4, "completion_tokens": 8}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    if info.stream:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        first = {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": TEXT}, "finish_reason": None}]}
        last = {"id": cid, "object": "chat.completion.chunk", "created": now, "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        for chunk in (first, last):
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                        "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        return 200, usage["total_tokens"]
    body = json.dumps({
        "id": cid, "object": "chat.completion", "created": now, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT}, "finish_reason": "stop"}],
        "usage": usage,
    }).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
    return 200, usage["total_tokens"]
