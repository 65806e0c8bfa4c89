"""Deterministic model outputs: generated words, embedding vectors, rerank scores.

Same input, same output, in every process, so tests can compare replicas and
caches can be exercised; nothing here pretends to be meaningful language.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct

_WORDS = (
    "the", "fabric", "engine", "token", "stream", "model", "replica", "queue", "cache", "vector",
    "light", "river", "stone", "cloud", "green", "quiet", "swift", "north", "ember", "delta",
    "orbit", "pixel", "maple", "coral", "amber", "echo", "lumen", "prism", "tide", "zephyr",
    "and", "of",
)
VOCABULARY = frozenset(_WORDS)


def token_text(seed: int, index: int) -> str:
    """The text of generated token `index` for a prompt with this seed."""
    word = _WORDS[(seed >> (index % 40) ^ index * 2654435761) % len(_WORDS)]
    return word if index == 0 else " " + word


def generated_text(seed: int, count: int) -> str:
    return "".join(token_text(seed, i) for i in range(count))


def embedding(text: str, dim: int) -> list[float]:
    """A unit vector derived from a hash of the text (blake2b in counter mode)."""
    values: list[float] = []
    counter = 0
    while len(values) < dim:
        block = hashlib.blake2b(text.encode(), digest_size=64, salt=counter.to_bytes(16, "big")).digest()
        # Map each 4-byte word to [-1, 1).
        values.extend(v / 2**31 - 1.0 for v in struct.unpack(">16I", block))
        counter += 1
    values = values[:dim]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def encode_base64(vector: list[float]) -> str:
    # OpenAI's base64 format: little-endian float32 array.
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


_WORD_RE = re.compile(r"\w+")


def relevance_score(query: str, document: str) -> float:
    """Word-overlap relevance in (0, 1); a hash breaks ties deterministically."""
    q = set(_WORD_RE.findall(query.lower()))
    d = set(_WORD_RE.findall(document.lower()))
    overlap = len(q & d) / len(q) if q else 0.0
    jitter = hashlib.blake2b(f"{query}\0{document}".encode(), digest_size=2).digest()
    tiebreak = int.from_bytes(jitter, "big") / 65536 * 0.01
    return round(0.01 + 0.97 * overlap + tiebreak, 6)
