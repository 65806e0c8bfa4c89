"""One decoding of the proxy path, and what the route is: the single source of truth for both the
gateway's decisions (body cap, caps on generation, scope rules) and the upstream request-target.

``/api/ai/openai/{endpoint}/{rest...}`` is split on the RAW path (percent-escapes kept). The
upstream receives the raw rest exactly as the client sent it; the gateway decides on the same rest
decoded once, the way the engine's router (Starlette) decodes it. The two can only differ where a
percent-escape changes the structure of the path, so those are refused with 400 instead of
guessed: an encoded ``/``, ``\\``, ``?``, ``#``, ``.`` or NUL, a dot segment (``.``/``..``) and an
empty segment. ``ep%2Fv1%2Ffiles`` therefore never picks the upload cap while the upstream routes
elsewhere, and an encoded ``?`` cannot smuggle a second query into a WebSocket URI.

Route kinds (``kind``):
  generate   a route that makes tokens (chat/completions, completions, responses, and any POST
             route not known to be non-generating): JSON body, generation caps, default max_tokens
  json       a known POST route that generates nothing (embeddings, rerank, score, batches...)
  upload     POST /v1/files and /v1/audio/*: multipart bodies, not parsed
  read       any other method: no body expected
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from common.errors import FabricError
from common.schemas import DNS_LABEL

PREFIX = "/api/ai/openai/"
PREFIX_B = PREFIX.encode()
ROOT_PREFIX = "/v1/"
_BAD_ESCAPE = re.compile(rb"%(?:2f|5c|3f|23|2e|00)", re.IGNORECASE)

# Which body field caps generation, per route, as vLLM reads it (first non-empty wins).
GENERATION_FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}
# Unknown generating routes: the largest of every field any engine might read.
ANY_GENERATION_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
NON_GENERATING = (
    "/v1/embeddings", "/v1/rerank", "/v2/rerank", "/rerank", "/v1/score", "/score", "/tokenize",
    "/detokenize", "/v1/tokenize", "/v1/detokenize", "/classify", "/v1/classify", "/pooling", "/v1/pooling",
    "/v1/moderations", "/v1/batches", "/v1/models", "/health", "/metrics", "/version", "/ping",
)
UPLOADS = ("/v1/files", "/v1/audio/")
# The API the gateway serves (each with what lies below it); every other path of the engine is
# 404 here: its control routes (/v1/load_lora_adapter, /v1/unload_lora_adapter, /sleep,
# /wake_up, /reset_prefix_cache, /collective_rpc, /start_profile, /metrics...) are the
# platform's (the gateway alone drives adapter loading), never a caller's.
SERVED = (
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/models", "/v1/files",
    "/v1/batches", "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/audio/speech", "/v1/moderations",
    "/v1/rerank", "/v2/rerank", "/rerank", "/v1/score", "/score", "/v1/classify", "/classify", "/v1/pooling",
    "/pooling", "/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize", "/v1/realtime",
)


class BadPath(FabricError):
    status = 400
    code = "invalid_path"


class NotServed(FabricError):
    status = 404
    code = "not_found"


def check_served(path: str) -> None:
    """NotServed (404) for a decoded path outside the OpenAI API the gateway serves (SERVED)."""
    if not any(_under(path, p) for p in SERVED):
        if any(_under("/v1" + path, p) for p in SERVED):  # a base URL without /v1
            raise NotServed(f"no route {path[:64]!r}: the OpenAI API is under /v1, so send /v1{path[:64]}; "
                            "the client's base URL should end in /v1 (.../api/ai/openai/ENDPOINT/v1)")
        raise NotServed(f"the gateway does not serve {path[:64]!r}; it serves the OpenAI API under /v1 "
                        "(chat/completions, completions, responses, embeddings, models, files, batches, ...)")


@dataclass(frozen=True)
class Route:
    endpoint: str
    path: str  # the rest below the endpoint, decoded once: what the gateway decides on
    target: bytes  # the raw rest plus the raw query: what the upstream receives
    kind: str  # generate | json | upload | read

    @property
    def generation_fields(self) -> tuple[str, ...]:
        return GENERATION_FIELDS.get(self.path.rstrip("/"), ANY_GENERATION_FIELDS)

    @property
    def is_upload(self) -> bool:
        return self.kind == "upload" and self.path.startswith("/v1/files")

    def startswith(self, *prefixes: str) -> bool:
        return any(_under(self.path, p) for p in prefixes)


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def route_kind(method: str, path: str) -> str:
    if method != "POST":
        return "read"
    if any(_under(path, p) for p in UPLOADS):
        return "upload"
    if any(_under(path, p) for p in NON_GENERATING):
        return "json"
    return "generate"


def parse_route(raw_path: bytes, query: bytes, method: str) -> Route:
    """The route of a raw ASGI path (bytes starting with PREFIX, or ROOT_PREFIX: the endpoint
    is then "", chosen later by the body's model); BadPath (400) when ambiguous."""
    if not raw_path.startswith(PREFIX_B):
        return _sub_route("", raw_path, query, method)  # /v1/...: decoded by the same rules
    rest = raw_path[len(PREFIX_B):]
    seg, _, tail = rest.partition(b"/")
    endpoint = unquote(seg.decode("latin-1"))
    if not DNS_LABEL.match(endpoint):
        raise BadPath("the endpoint in the path is not a valid endpoint name")
    return _sub_route(endpoint, b"/" + tail, query, method)


def is_root(path: str) -> bool:
    """The gateway root's OpenAI API (one base URL for every model)."""
    return path == "/v1" or path.startswith(ROOT_PREFIX)


def _sub_route(endpoint: str, raw_sub: bytes, query: bytes, method: str) -> Route:
    if _BAD_ESCAPE.search(raw_sub):
        raise BadPath("the path holds an encoded '/', '\\', '?', '#', '.' or NUL; send it unencoded")
    try:
        path = unquote(raw_sub.decode("ascii"), errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise BadPath("the path is not ASCII with valid UTF-8 percent-escapes") from None
    segments = path.split("/")[1:]
    if any(s in (".", "..") for s in segments) or "" in segments[:-1] or "\\" in path:
        raise BadPath("the path has an empty, '.' or '..' segment or a backslash")
    target = raw_sub + b"?" + query if query else raw_sub
    return Route(endpoint, path, target, route_kind(method, path))
