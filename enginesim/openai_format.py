"""OpenAI wire shapes: response objects, stream chunks, SSE framing, error bodies.

Kept apart from the routes so the shapes can be read (and diffed against vLLM's
`protocol.py`) in one place. JSON is compact: this sits on the benchmark path.
"""

from __future__ import annotations

import json

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def sse(obj: dict) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def to_json(obj: dict) -> bytes:
    return _dumps(obj).encode()


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_chunk(rid: str, created: int, model: str, delta: dict, finish_reason: str | None = None) -> dict:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def chat_completion(rid: str, created: int, model: str, text: str, finish_reason: str, use: dict) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ],
        "usage": use,
    }


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason: str | None = None) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


def completion(rid: str, created: int, model: str, text: str, finish_reason: str, use: dict) -> dict:
    body = completion_chunk(rid, created, model, text, finish_reason)
    body["usage"] = use
    return body


def usage_chunk(rid: str, created: int, model: str, obj: str, use: dict) -> dict:
    # vLLM's final chunk with stream_options.include_usage: no choices, just usage.
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def error_body(message: str, err_type: str, code: str | int, param: str | None = None) -> dict:
    # OpenAI's shape; `code` is a stable string so it also fits Fabric's {"error": {"code", "message"}}.
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
