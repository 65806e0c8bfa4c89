"""Inflate a gzip body without trusting it: at most ``limit`` bytes come out, and a body that would
inflate past that (a gzip bomb) is refused as soon as it does, never held whole. One gzip member
exactly: anything cut short or followed by other bytes is refused too. Used wherever a peer sends
gzip: fabricd's request guard (an agent's report) and the engine scraper (a metrics page)."""

from __future__ import annotations

import zlib


class GzipTooLarge(ValueError):
    """The body inflates past the limit."""


class GzipInvalid(ValueError):
    """The body is not one whole gzip member."""


def gunzip_bounded(body: bytes, limit: int) -> bytes:
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
    try:
        out = inflate.decompress(body, limit + 1)
    except zlib.error:
        raise GzipInvalid("not valid gzip") from None
    if len(out) > limit:
        raise GzipTooLarge(f"decompresses to over {limit} bytes")
    if not inflate.eof or inflate.unused_data:
        raise GzipInvalid("not one whole gzip member")
    return out
