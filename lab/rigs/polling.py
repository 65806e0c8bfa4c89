"""Helpers the subprocess-driven tests share: polling for a condition (`wait_for`, and
`wait_for_async` inside an event loop) and a FABRIC_-free environment."""

from __future__ import annotations

import asyncio
import inspect
import os
import time


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Call ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


async def wait_for_async(predicate, timeout: float, what: str, interval: float = 0.25):
    """`wait_for` inside an event loop: sleeps with asyncio, and awaits ``predicate()`` when it
    returns an awaitable, so the loop's other tasks run while it waits."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any FABRIC_ setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(extra or {})
    return env


def scrape_gauge(url: str, name: str) -> float | None:
    """The unlabelled sample NAME on URL's /metrics, or None (no answer, no such sample)."""
    import re

    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None
