"""Usage always known (issue 37): a client that streams chat or text completions without
``stream_options.include_usage`` gets the engine asked for usage anyway, and the usage chunk
(OpenAI's and vLLM's final event with empty ``choices`` and a ``usage``) is taken out of what
the client receives, so the client sees the bytes it would have seen without the injection.
A call that ends with no usage at all is charged the product notes' rule (its max_tokens times
its choices, or 1) and counted in fabric_gateway_usage_missing.

Only the engine's own routes are rewritten: an external provider's or an adapter call's body is
forwarded as the client sent it.
"""

from __future__ import annotations

from gateway.request_body import BodyInfo, loads, with_field

STREAMED_ROUTES = ("/v1/chat/completions", "/v1/completions")


def inject(info: BodyInfo, body: bytes, path: str) -> bytes | None:
    """The body asking for usage, or None when it is not streamed or already asks for it."""
    data = info.data
    if not info.stream or data is None or path.rstrip("/") not in STREAMED_ROUTES:
        return None
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    if options is not None and not isinstance(options, dict):
        return None  # the engine refuses it as it is; never hide that
    asked = {**(options or {}), "include_usage": True}
    return with_field(body, data, "stream_options", asked)


def fallback_tokens(info: BodyInfo) -> int:
    """What a generating call with no usage in its answer is charged: max_tokens (per choice), or 1."""
    return (info.max_tokens or 0) * max(1, info.choices) or 1


class UsageStripper:
    """Takes the usage-only events out of an SSE byte stream, whatever the chunk boundaries:
    complete events (ending in a blank line) are passed on at once, a partial one waits for its
    end. Every other byte is relayed unchanged and in order."""

    def __init__(self) -> None:
        self._pending = b""
        self.stripped = 0

    def feed(self, chunk: bytes) -> bytes:
        ready, self._pending = complete_events(self._pending, chunk)
        if b'"usage"' not in ready:
            return ready
        return b"".join(e for e in _events(ready) if not self._usage_only(e))

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest

    def _usage_only(self, event: bytes) -> bool:
        if b'"usage"' not in event:
            return False
        body = event.strip()
        if not body.startswith(b"data:"):
            return False
        try:
            obj = loads(body[5:])
        except ValueError:
            return False
        hit = isinstance(obj, dict) and obj.get("choices") == [] and isinstance(obj.get("usage"), dict)
        self.stripped += hit
        return hit


def complete_events(pending: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """(the complete SSE events of pending + chunk, the partial event that waits for its end)."""
    data = pending + chunk if pending else chunk
    end = data.rfind(b"\n\n")
    if end < 0:
        return b"", data
    return data[:end + 2], data[end + 2:]


def _events(data: bytes) -> list[bytes]:
    """``data`` (ending in a blank line) split into its events, each keeping its blank line."""
    parts = data.split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]]
