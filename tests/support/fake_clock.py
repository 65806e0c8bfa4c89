"""One fake clock for the suite's limit windows: a time that moves only when a test moves it.

It lives in a file, so a gateway child process reads the same time as the test that started it
(`FABRIC_GATEWAY_CLOCK_FILE`, gateway.limits.window_clock). tests/gateway/gateway_harness.py
starts every gateway on SUITE_CLOCK; a test that reads a window counter reads it at
SUITE_CLOCK.now, and one that needs the next window calls next_window(). So no check straddles a
wall-clock minute (a call settled in the next window is charged there only beyond its estimate,
by design, so an exact-charge check across a boundary would read less than it charged).

The time starts 1 s into a UTC day (so into a minute too) and stays there until a test moves it:
every minute and day window of a test is the same one from its first call to its last check.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

START = 20_834 * 86_400 + 1.0  # 2027-01-16 00:00:01 UTC: the first second of a day and a minute


class FakeClock:
    """Callable like time.time; ``now`` reads and sets the file (an atomic replace)."""

    def __init__(self, path: Path, start: float = START):
        self.path = path
        self.now = start

    @property
    def now(self) -> float:
        return float(self.path.read_text())

    @now.setter
    def now(self, value: float) -> None:
        tmp = self.path.with_name(self.path.name + ".new")
        tmp.write_text(repr(float(value)))
        os.replace(tmp, self.path)

    def __call__(self) -> float:
        return self.now

    def next_window(self, window_secs: int = 60) -> float:
        """Move to 1 s into the next window of ``window_secs``; the new time."""
        self.now = (self.now // window_secs + 1) * window_secs + 1.0
        return self.now


def _suite_clock() -> FakeClock:
    where = Path(tempfile.mkdtemp(prefix="fabric-test-clock-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    return FakeClock(where / "now")


SUITE_CLOCK = _suite_clock()
