"""GET /ready (and /readyz): whether this gateway can enforce its limits now, for the TCP load
balancer in front of several gateways. /health stays liveness (the process answers); /ready
reads the store (the limits' exact counters, keys and endpoints live there) within
READY_TIMEOUT_S, so a gateway cut off from it is taken out of rotation instead of answering
every call with a 503. The answer names no key, address or secret: only which check failed.
"""

from __future__ import annotations

import asyncio
import json

from common import keyspace
from common.store.base import Store

READY_TIMEOUT_S = 2.0


async def store_failure(store: Store) -> str | None:
    """None when the store answered a read within READY_TIMEOUT_S, else the failure's class name
    (never its text). /ready and the fabric_store_up gauge of /metrics both ask this."""
    try:
        await asyncio.wait_for(asyncio.to_thread(store.get, keyspace.counters("ready-probe")), READY_TIMEOUT_S)
    except Exception as exc:  # any failure to read is "not ready"
        return type(exc).__name__
    return None


async def readiness(store: Store) -> tuple[int, bytes]:
    failure = await store_failure(store)
    if failure is not None:
        return 503, json.dumps({"status": "not_ready", "store": "unreachable", "reason": failure}).encode()
    return 200, json.dumps({"status": "ready", "store": "reachable"}).encode()
