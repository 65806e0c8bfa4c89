"""multipart/form-data, just enough for POST /v1/files.

Starlette's form parser needs python-multipart, which the engine does not depend on; the
framing is simple enough to read here (RFC 7578: parts split on CRLF--boundary).
"""

from __future__ import annotations

import re

_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')


def _header_params(value: str) -> dict[str, str]:
    return {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)) for m in _PARAM.finditer(value)}


def parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data -> {field name: (filename or None, bytes)}; ValueError when malformed."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise ValueError("expected a multipart/form-data body")
    boundary = _header_params(content_type).get("boundary")
    if not boundary:
        raise ValueError("the multipart content-type has no boundary")
    delim = b"\r\n--" + boundary.encode("latin-1")
    chunks = (b"\r\n" + body).split(delim)
    fields: dict[str, tuple[str | None, bytes]] = {}
    closed = False
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):
            closed = True
            break
        head, sep, content = chunk.partition(b"\r\n\r\n")
        if not sep:
            raise ValueError("a multipart part has no header block")
        name = filename = None
        for raw in head.split(b"\r\n"):
            key, _, value = raw.decode("utf-8", "replace").partition(":")
            if key.strip().lower() == "content-disposition":
                params = _header_params(value)
                name, filename = params.get("name"), params.get("filename")
        if name is None:
            raise ValueError("a multipart part has no content-disposition name")
        fields[name] = (filename, content)
    if not closed:
        raise ValueError("the multipart body is truncated (no closing boundary)")
    return fields
