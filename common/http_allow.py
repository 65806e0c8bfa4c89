"""The Allow header of a 405: every method the path serves, not only the methods of the first
route whose path matched (Starlette's default; FastAPI registers one route per method, so
OPTIONS /api/ai/models answered ``Allow: GET`` though POST is served too). Found by
schemathesis' allow_header_conformance check (docs/reliability.md).

The methods are read from the app's own OpenAPI document, the list of what it serves that a
client sees; it is built once and cached by FastAPI, and a 405 is rare."""

from __future__ import annotations

import re

_PARAM = re.compile(r"\\\{[^}/]+\\\}")


def allowed_methods(doc: dict, path: str) -> list[str]:
    """Sorted methods of every documented path template that ``path`` matches."""
    methods: set[str] = set()
    for template, ops in doc.get("paths", {}).items():
        if re.fullmatch(_PARAM.sub("[^/]+", re.escape(template)), path):
            methods |= {m.upper() for m in ops if m.lower() in {"get", "put", "post", "delete", "patch",
                                                                  "options", "head"}}
    return sorted(methods)


def allow_headers(request, exc_headers: dict | None) -> dict | None:
    """The headers of a 405 answer: the exception's own, with Allow listing every method."""
    methods = allowed_methods(request.app.openapi(), request.url.path)
    if not methods:
        return exc_headers
    return {**(exc_headers or {}), "Allow": ", ".join(methods)}
