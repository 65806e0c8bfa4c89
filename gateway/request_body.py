"""What the gateway needs from an OpenAI request body, read once: model, stream, max_tokens,
the prompt's size (for the one-token-per-four-characters estimate) and its first 64
characters (session affinity only; never logged or stored). Also reading usage back out of
upstream responses, streamed or not."""

from __future__ import annotations

import json
from dataclasses import dataclass

from common.errors import InvalidInput

AFFINITY_CHARS = 64


@dataclass(frozen=True)
class BodyInfo:
    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    prompt_chars: int = 0
    prompt_head: str = ""


def _text_of(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text_of(v) for v in value)
    if isinstance(value, dict):
        if "content" in value:
            return _text_of(value["content"])
        if "text" in value:
            return _text_of(value["text"])
    return ""


def parse_body(body: bytes, content_type: str) -> BodyInfo:
    if not body or "json" not in content_type:
        return BodyInfo()
    try:
        data = json.loads(body)
    except ValueError:
        raise InvalidInput("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        return BodyInfo()
    model = data.get("model")
    max_tokens = data.get("max_tokens", data.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0):
        raise InvalidInput("max_tokens must be a non-negative integer", code="invalid_max_tokens")
    if "messages" in data:
        text = _text_of(data["messages"])
    elif "prompt" in data:
        text = _text_of(data["prompt"])
    elif "input" in data:
        text = _text_of(data["input"])
    else:
        text = _text_of(data.get("query", "")) + _text_of(data.get("documents", []))
    return BodyInfo(
        model=model if isinstance(model, str) else None,
        stream=data.get("stream") is True,
        max_tokens=max_tokens,
        prompt_chars=len(text),
        prompt_head=text[:AFFINITY_CHARS],
    )


def usage_tokens(obj) -> int | None:
    if isinstance(obj, dict):
        usage = obj.get("usage")
        if isinstance(usage, dict):
            total = usage.get("total_tokens")
            if isinstance(total, int):
                return total
            parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
            if any(isinstance(p, int) for p in parts):
                return sum(p for p in parts if isinstance(p, int))
    return None


class SseUsageScanner:
    """Feeds on raw SSE bytes; remembers the last usage seen. Only lines that mention usage are
    parsed, so the cost per chunk is a substring search."""

    MAX_TAIL = 65536

    def __init__(self) -> None:
        self._tail = b""
        self.tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk
        if b'"usage"' not in data:
            self._tail = data[data.rfind(b"\n") + 1:][-self.MAX_TAIL:]
            return
        lines = data.split(b"\n")
        self._tail = lines.pop()[-self.MAX_TAIL:]
        for line in lines:
            if line.startswith(b"data:") and b'"usage"' in line:
                try:
                    tokens = usage_tokens(json.loads(line[5:]))
                except ValueError:
                    continue
                if tokens is not None:
                    self.tokens = tokens
