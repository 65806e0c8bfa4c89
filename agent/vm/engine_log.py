"""An engine's log as the agent serves it (GET /v1/vms/{id}/logs): the lab and dry-run drivers
write each replica's engine output to STATE/<replica>.log; the libvirt driver has the guest's
serial console logged by libvirt to STATE/console/<replica>.log (domain XML `<log file>`).

`read_chunk` reads a bounded piece from a byte offset, so a follower (`fabricctl ai logs -f`)
asks again from `next_offset`; a negative offset counts from the end (the last N bytes). The
text is decoded leniently: a log is for people, a broken byte must not fail the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_CHUNK = 1 << 20  # bytes per answer, whatever the caller asks


@dataclass(frozen=True)
class LogChunk:
    text: str
    offset: int  # where this chunk starts
    next_offset: int  # where the next read starts
    size: int  # the file's size now


def read_chunk(path: Path, offset: int, limit: int) -> LogChunk:
    limit = max(1, min(limit, MAX_CHUNK))
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        f.seek(start)
        data = f.read(limit)
    return LogChunk(data.decode("utf-8", errors="replace"), start, start + len(data), size)
