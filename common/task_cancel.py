"""A task's cancellation count where Python keeps one (3.11+), and what stands in for it on 3.10.

``asyncio.Task.cancelling()``/``uncancel()`` (3.11) count the cancellations asked of a task, so
code that cancels its own task (a deadline that passed, a client that left) undoes exactly its
own request and leaves any other standing, which is asyncio.timeout's rule. Python 3.10 keeps no
count: there ``cancelling`` reads 0 and ``uncancel`` does nothing, so a deadline or a departed
client that cancelled the task turns that cancellation into its own error even when a shutdown
asked as well (the shutdown's cancel of the task's next await still ends it).
"""

from __future__ import annotations

import asyncio
import sys

if sys.version_info >= (3, 11):
    def cancelling(task: asyncio.Task) -> int:
        return task.cancelling()

    def uncancel(task: asyncio.Task) -> int:
        return task.uncancel()
else:
    def cancelling(task: asyncio.Task) -> int:
        return 0

    def uncancel(task: asyncio.Task) -> int:
        return 0
