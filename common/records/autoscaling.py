"""The autoscaler's own small records: its memory per deployment (/fabric/scaling/<deployment>: the
last scale and decision, JSON of controlplane.scaling.decide.Memory) and the gateway's last call
per endpoint (/fabric/demand/<endpoint>: {"at": unix time}). Both are read tolerantly: a value that
is not what it should be reads as absent, so the autoscaler starts afresh rather than stopping."""

from __future__ import annotations

import json

from common import keyspace
from common.store.base import Store


def memory(store: Store, deployment: str) -> dict | None:
    kv = store.get(keyspace.scaling(deployment))
    if kv is None:
        return None
    try:
        value = json.loads(kv.value)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def put_memory(store: Store, deployment: str, value: dict) -> None:
    store.put(keyspace.scaling(deployment), json.dumps(value))


def forget(store: Store, deployment: str) -> None:
    store.delete(keyspace.scaling(deployment))


def note_demand(store: Store, endpoint: str, at: float) -> None:
    """The gateway saw a call for ``endpoint`` at ``at`` (unix time; it writes at most one a few seconds)."""
    store.put(keyspace.demand(endpoint), json.dumps({"at": at}))


def demand_at(store: Store, endpoint: str) -> float | None:
    kv = store.get(keyspace.demand(endpoint))
    try:
        return float(json.loads(kv.value)["at"]) if kv is not None else None
    except (ValueError, KeyError, TypeError):
        return None
