"""The engine's own reason for dying, from the tail of its log (pure).

When a replica's VM or engine process has ended, the reconciler reads the last bytes of its
engine log (agent GET /v1/vms/{id}/logs) and makes the replica Failed with this line as its
reason, so `fabricctl ai explain failure REPLICA` and the deployment's status say what the
engine said ("OSError: ... does not appear to have a file named config.json"), not "health
failed".

Choice: the last exception line (``SomethingError: ...``) that is not one of vLLM's wrappers
pointing elsewhere ("Engine core initialization failed. See root cause above"); else the last
line logged at ERROR or CRITICAL; else the last line that is not blank. ANSI colours are
stripped and the line is cut to ``MAX_LINE`` characters.
"""

from __future__ import annotations

import re

MAX_LINE = 300
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EXCEPTION = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::\s*\S.*)?$")
_LEVEL = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b")
_WRAPPERS = ("see root cause above", "engine core initialization failed", "engine process failed to start")


def engine_error_line(log_tail: str) -> str:
    lines = [_ANSI.sub("", line).strip() for line in log_tail.splitlines()]
    lines = [line for line in lines if line]
    exceptions = [line for line in lines if _EXCEPTION.match(line)]
    specific = [line for line in exceptions if not any(w in line.lower() for w in _WRAPPERS)]
    for group in (specific, exceptions, [line for line in lines if _LEVEL.search(line)], lines):
        if group:
            return group[-1][:MAX_LINE]
    return "the engine exited without writing a log line"
