"""Chained hashes of a prompt's fixed-size chunks: the shape of an engine's prefix-cache blocks.

Each chunk's hash covers every chunk before it, so one hash names a whole prefix and two prompts
share a hash exactly when they share everything up to it. Only full chunks are hashed (an engine
never caches a partial block). The gateway's prefix router (64 characters, about one 16-token
block) and the engine simulator's prefix cache (its blocks) use the same function, so the
router's idea of a shared prefix is the engine's.
"""

from __future__ import annotations

import hashlib


def chained_chunk_hashes(text: str, chunk_chars: int, max_chunks: int | None = None, seed: str | None = None) -> list[bytes]:
    """``seed`` (a cache salt) starts the chain: prompts under different seeds share no hash, as
    an engine's blocks under different cache salts share nothing."""
    end = len(text) if max_chunks is None else min(len(text), chunk_chars * max_chunks)
    out: list[bytes] = []
    prev = hashlib.blake2b(seed.encode(), digest_size=12, person=b"fabric-seed").digest() if seed else b""
    for start in range(0, end - chunk_chars + 1, chunk_chars):
        prev = hashlib.blake2b(prev + text[start:start + chunk_chars].encode(), digest_size=12).digest()
        out.append(prev)
    return out
