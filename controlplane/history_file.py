"""The console's bounded history (controlplane.history) kept across a fabricd restart.

    HistoryFile(path).load_into(history)     at start: the last saved series and marks
    HistoryFile(path).save_if_due(history)   from the loops' hooks: at most every SAVE_EVERY_S,
                                             only when something was recorded since
    HistoryFile(path).save(history)          at exit (atexit), so a clean stop loses nothing

The file is ``{state_dir}/console-history.json.gz``: gzipped JSON of every series and its marks,
written to a temporary file and renamed over the old one, so a crash mid-write leaves the last
whole snapshot. A SIGKILL loses at most SAVE_EVERY_S of points. What it holds is what the
history holds (its bounds), and points older than the charts' hour are dropped when loaded. The
file is this fabricd's own: another fabricd that becomes leader starts from its own file. An
unreadable or malformed file is ignored (logged once): the charts start empty, as before.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import time
from pathlib import Path

from common.private_fs import write_private
from controlplane.history import History

log = logging.getLogger("fabric.history")
FILE_NAME = "console-history.json.gz"
SAVE_EVERY_S = 10.0
KEEP_S = 3600.0  # the charts' window (controlplane.console.charts.WINDOW_S)
VERSION = 1


class HistoryFile:
    def __init__(self, path: Path, every_s: float = SAVE_EVERY_S):
        self.path, self.every_s = Path(path), every_s
        self._last_save = 0.0
        self._lock = threading.Lock()

    def load_into(self, history: History, now: float | None = None) -> int:
        """Series loaded (0 when there is no file or it cannot be read)."""
        now = time.time() if now is None else now
        try:
            data = json.loads(gzip.decompress(self.path.read_bytes()))
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}")
            points = [(tuple(s), [(float(t), float(v)) for t, v in pts]) for s, pts in data["points"]]
            marks = [(tuple(s), [(float(t), str(m)) for t, m in ms]) for s, ms in data["marks"]]
        except FileNotFoundError:
            return 0
        except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError) as exc:
            log.warning("console history %s not loaded (%s): the charts start empty", self.path, exc)
            return 0
        since = now - KEEP_S
        history.restore([(s, [p for p in pts if p[0] >= since]) for s, pts in points],
                        [(s, [m for m in ms if m[0] >= since]) for s, ms in marks])
        return len(points)

    def save_if_due(self, history: History, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        if now - self._last_save < self.every_s or not history.changed_since_save:
            return False
        self.save(history, now)
        return True

    def save(self, history: History, now: float | None = None) -> None:
        with self._lock:
            points, marks = history.snapshot()
            raw = json.dumps({"version": VERSION, "saved_at": time.time() if now is None else now,
                              "points": [[list(s), pts] for s, pts in points],
                              "marks": [[list(s), ms] for s, ms in marks]}, separators=(",", ":"))
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            try:
                write_private(tmp, gzip.compress(raw.encode(), compresslevel=3))  # 0600, as the state dir's files
                os.replace(tmp, self.path)
            except OSError as exc:
                log.warning("console history not saved to %s: %s", self.path, exc)
                tmp.unlink(missing_ok=True)
                return
            self._last_save = time.time() if now is None else now
