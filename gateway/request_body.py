"""What the gateway needs from an OpenAI request body, read once and the way vLLM will read it:
model, stream, the generation cap, the prompt's size (for the one-token-per-four-characters
estimate) and its first 64 characters (session affinity only; never logged or stored). Also
reading usage back out of upstream responses, streamed or not.

Reading it the way the engine does (so no cap can be dodged):
- the body of a JSON route is JSON by content, whatever Content-Type claims (media types compared
  case-insensitively); a body that does not parse is 400 when it claims JSON, else 415; a JSON
  body that is not an object is 400;
- nesting deeper than MAX_DEPTH is refused (400) before the parser recurses;
- the generation cap is the route's field as vLLM reads it (chat: ``max_completion_tokens`` before
  ``max_tokens``; completions: ``max_tokens``; responses: ``max_output_tokens``; unknown
  generating routes: the largest of them). When absent, the gateway writes the default
  (FABRIC_DEFAULT_MAX_TOKENS, bounded by FABRIC_MAX_GENERATED_TOKENS and what the context has
  left) into the forwarded body, so the engine can never generate more than was counted;
- ``n`` and ``best_of`` multiply the generated-token estimate;
- ``model``, when present, is a string of at most MAX_MODEL_CHARS letters, digits or ``._:@+/-``
  (``valid_model``): anything else is 400 before the name reaches a cache, an audit row or a
  metric label, so a caller cannot size what the gateway keeps.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import accumulate

import orjson

from common.errors import FabricError, InvalidInput
from gateway.routes import ANY_GENERATION_FIELDS, Route

AFFINITY_CHARS = 64
MAX_MODEL_CHARS = 256
# Model names as clients spell them: HF "org/name", LoRA adapters, provider names ("ft:a:b:c").
_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+/-]*")
MAX_DEPTH = 64
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1
_BRACKETS_ONLY = bytes(b for b in range(256) if b not in b"[]{}")


class UnsupportedMediaType(FabricError):
    status = 415
    code = "unsupported_media_type"


class BadJson(FabricError):
    status = 400
    code = "invalid_json"


class BadModel(FabricError):
    status = 400
    code = "invalid_model"


@dataclass(frozen=True)
class BodyInfo:
    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None  # the generation cap the engine will apply (after any default)
    choices: int = 1  # n / best_of: sequences generated per call
    prompt_chars: int = 0
    prompt_head: str = ""
    body: bytes | None = None  # the body to forward when the gateway rewrote it (default cap)
    data: dict | None = None  # the parsed object (scope checks on batches)


def media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


def is_json_media(content_type: str) -> bool:
    mt = media_type(content_type)
    return mt == "application/json" or (mt.startswith("application/") and mt.endswith("+json"))


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects, strings skipped (C-speed passes only)."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        return 0  # cannot be deeper than the number of openers
    stripped = _STRINGS.sub(b"", body).translate(None, _BRACKETS_ONLY)
    return max(accumulate(_DEPTH_STEP[b] for b in stripped), default=0)


def loads(data: bytes | bytearray):
    """json.loads's answer, through orjson when it can (3-4x faster on these bodies: ~8 µs a
    call). What orjson refuses (NaN, 1e400, a BOM...) goes to json, and so does a body with a
    19-digit run (orjson reads an integer past 64 bits as a float; json as an int), so what is
    accepted and what it parses to stay json's (and so vLLM's)."""
    if _LONG_RUN not in data.translate(_DIGITS_TO_0):  # ~0.4 µs; a regex search took ~5
        try:
            return orjson.loads(data)
        except ValueError:
            pass
    return json.loads(data)


_DIGITS_TO_0 = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))  # digits -> "0", the rest -> " "
_LONG_RUN = b"0" * 19


def load_json(body: bytes, content_type: str):
    if json_depth(body) > MAX_DEPTH:
        raise BadJson(f"the JSON body nests deeper than {MAX_DEPTH} levels")
    try:
        return loads(body)
    except (ValueError, RecursionError):
        if is_json_media(content_type):
            raise BadJson("the request body is not valid JSON") from None
        raise UnsupportedMediaType("the request body is not JSON; this route takes application/json") from None


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



def valid_model(model) -> str | None:
    """The body's ``model`` (None when absent or null); BadModel (400) for anything that is not
    a short name."""
    if model is None:
        return None
    if not isinstance(model, str):
        raise BadModel("model must be a string")
    if len(model) > MAX_MODEL_CHARS or not _MODEL.fullmatch(model):
        raise BadModel(f"model must be 1-{MAX_MODEL_CHARS} letters, digits or '._:@+/-', starting with a "
                       "letter or digit")
    return model


def _int_field(data: dict, name: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput(f"{name} must be a non-negative integer", code="invalid_max_tokens")
    return value


def generation_cap(data: dict, fields: tuple[str, ...]) -> tuple[int | None, str | None]:
    """(the cap the engine applies, the field it came from); (None, None) when absent. Each
    field is validated; the first non-empty one wins (vLLM: ``max_completion_tokens or
    max_tokens``); for an unknown route (every field listed) the largest wins."""
    values = [(_int_field(data, f), f) for f in fields]
    present = [(v, f) for v, f in values if v]
    if not present:
        return None, None
    if fields == ANY_GENERATION_FIELDS:
        return max(present)
    return present[0]


def _choices(data: dict) -> int:
    most = 1
    for name in ("n", "best_of"):
        v = data.get(name)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 128:
            raise InvalidInput(f"{name} must be an integer from 1 to 128", code=f"invalid_{name}")
        most = max(most, v)
    return most


def with_field(body: bytes, data: dict, name: str, value: int | str) -> bytes:
    """The body with one top-level field set. Spliced in before the closing brace when the body
    is UTF-8 text framed by '{...}' (nothing else changes; a later duplicate key wins in the
    engine's parser, so a client's own null or 0 for the field is overridden), else
    re-serialised."""
    stripped = body.strip(b" \t\r\n")
    if stripped.startswith(b"{") and stripped.endswith(b"}"):
        return stripped[:-1] + (b"," if data else b"") + f'"{name}":{json.dumps(value)}}}'.encode()
    return json.dumps({**data, name: value}).encode()


def parse_body(body: bytes, content_type: str, route: Route, policy: GenerationPolicy | None = None) -> BodyInfo:
    if route.kind not in ("generate", "json") or not body:
        return BodyInfo()
    data = load_json(body, content_type)
    if not isinstance(data, dict):
        raise BadJson("the request body must be a JSON object")
    model = valid_model(data.get("model"))
    if "messages" in data:
        text = _text_of(data["messages"])
    elif "prompt" in data:
        text = _text_of(data["prompt"])
    elif "input" in data:
        text = _text_of(data["input"])
    else:
        text = _text_of(data.get("query", "")) + _text_of(data.get("documents", []))
    prompt_chars = len(text)
    max_tokens, new_body, choices = None, None, 1
    if route.kind == "generate":
        fields = route.generation_fields
        max_tokens, _ = generation_cap(data, fields)
        choices = _choices(data)
        if max_tokens is None and policy is not None:
            max_tokens = policy.default_for((prompt_chars + 3) // 4)
            name = fields[0] if fields != ANY_GENERATION_FIELDS else "max_tokens"
            new_body = with_field(body, data, name, max_tokens)
    return BodyInfo(
        model=model,
        stream=data.get("stream") is True,
        max_tokens=max_tokens,
        choices=choices,
        prompt_chars=prompt_chars,
        prompt_head=text[:AFFINITY_CHARS],
        body=new_body,
        data=data,
    )


@dataclass(frozen=True)
class GenerationPolicy:
    """The default generation cap for a body that names none: FABRIC_DEFAULT_MAX_TOKENS, never
    above FABRIC_MAX_GENERATED_TOKENS or what FABRIC_MAX_CONTEXT leaves after the prompt."""

    default_max_tokens: int
    max_generated_tokens: int | None
    max_context: int

    def default_for(self, prompt_tokens: int) -> int:
        cap = self.default_max_tokens
        if self.max_generated_tokens:
            cap = min(cap, self.max_generated_tokens)
        return max(1, min(cap, self.max_context - prompt_tokens))


class TokenUsage(int):
    """An answer's total tokens (the int every limit charges) carrying the engine's own split:
    ``input`` (prompt/input tokens), ``output`` (completion/output tokens) and ``cached`` (prompt
    tokens served from the prefix cache; 0 when the engine did not say). The usage ledger
    (gateway.usage_ledger) records the split; arithmetic on it gives a plain int."""

    input: int
    output: int
    cached: int

    def __new__(cls, total: int, input_tokens: int, output_tokens: int, cached: int = 0) -> TokenUsage:
        made = super().__new__(cls, total)
        made.input, made.output, made.cached = input_tokens, output_tokens, cached
        return made


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_tokens(obj) -> TokenUsage | None:
    """The total of an answer's ``usage``: chat and completions (prompt/completion tokens), the
    Responses API (input/output tokens; in a stream, the final event's ``response.usage``), with
    the split as the engine counted it (cached: ``prompt_tokens_details.cached_tokens`` or
    ``input_tokens_details.cached_tokens``)."""
    if isinstance(obj, dict):
        usage = obj.get("usage")
        if usage is None and isinstance(obj.get("response"), dict):
            usage = obj["response"].get("usage")
        if isinstance(usage, dict):
            parts = [usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("input_tokens"),
                     usage.get("output_tokens")]
            total = usage.get("total_tokens")
            if not isinstance(total, int):
                if not any(isinstance(p, int) for p in parts):
                    return None
                total = sum(p for p in parts if isinstance(p, int))
            details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
            cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
            return TokenUsage(total, _int(parts[0]) + _int(parts[2]), _int(parts[1]) + _int(parts[3]), cached)
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
                    tokens = usage_tokens(loads(line[5:]))
                except ValueError:
                    continue
                if tokens is not None:
                    self.tokens = tokens
