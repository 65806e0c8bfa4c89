"""One JSON record file per replica, shared by the drivers that keep their own bookkeeping.

The dry-run and lab drivers both remember what they started in STATE_DIR/<replica_id>.json
so that a restarted agent adopts its engines; the file is replaced atomically on save.
engine_alive() tells whether a recorded engine pid is still that engine.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Generic, TypeVar

R = TypeVar("R")


class RecordDir(Generic[R]):
    """Dataclass records of type `kind`, one file per replica id under `directory`."""

    def __init__(self, directory: str | Path, kind: type[R]):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.kind = kind

    def path(self, replica_id: str) -> Path:
        return self.dir / f"{replica_id}.json"

    def load(self, replica_id: str) -> R | None:
        """The record, or None when it is missing or unreadable."""
        try:
            return self.kind(**json.loads(self.path(replica_id).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def save(self, rec: R) -> None:
        path = self.path(rec.replica_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(rec)))
        os.replace(tmp, path)

    def all(self) -> list[R]:
        """Every readable record, in replica-id order."""
        recs = (self.load(p.stem) for p in sorted(self.dir.glob("*.json")))
        return [r for r in recs if r is not None]

    def remove(self, replica_id: str) -> None:
        self.path(replica_id).unlink(missing_ok=True)


def engine_alive(pid: int, replica_id: str) -> bool:
    """True when pid runs and is still our engine (its cmdline names the replica)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] == "Z":  # exited, not yet reaped
        return False
    return replica_id.encode() in raw.split(b"\0")
