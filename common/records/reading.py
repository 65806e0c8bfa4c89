"""The door's parse policy: reading one record raises, listing skips and counts.

A stored value can fail to parse as its kind's model: a hand-edited key, a record a later
release wrote with a field this one refuses, a value cut short. Every typed reader of
common.records treats it one way:

  - ``one`` (a get of one key) raises UnreadableRecord naming the kind and the key: the caller
    asked for that record and must not act as if it were absent (an API answers 500 with
    code ``unreadable_record``; the operator fixes or deletes the key);
  - ``each`` (a list) returns the records that parse and skips the rest, so one bad key never
    stops a loop or a listing; each skip adds one to ``fabric_records_unreadable_total{kind}``
    (on the /metrics of fabricd and the gateway: ``install``) and the key is logged once.

The counter is process-wide (the records layer is called with a store, not an app), like the
process gauges of common.runtime_metrics; each app's registry exposes it. Its only label is the
kind, a fixed set of names, never a key or a tenant.
"""

from __future__ import annotations

import builtins
import json
import logging
import threading
from collections.abc import Iterable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ValidationError

from common.errors import UnreadableRecord
from common.store.base import KV

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)

UNREADABLE = Counter("fabric_records_unreadable", "Stored records a list skipped because they do not parse, by kind",
                     ["kind"], registry=None)
_LOGGED_MAX = 1000  # keys logged once each; past this many a skip is only counted
_logged: set[str] = set()
_lock = threading.Lock()

__all__ = ["UnreadableRecord", "each", "each_value", "install", "one", "pairs", "parse", "skipped", "value"]


def parse(model: type[M], value: str) -> M:
    # "stored": a record loads as it was accepted (docs: orchestration_state._parse).
    return model.model_validate_json(value, context={"stored": True})


def _why(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "value"
        return f"{where}: {first.get('msg', 'invalid')}"
    return "not JSON"


def one(model: type[M], kv: KV, kind: str) -> M:
    """The record at ``kv``; UnreadableRecord naming ``kind`` and the key when it does not parse."""
    try:
        return parse(model, kv.value)
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        raise UnreadableRecord(f"the {kind} record at {kv.key} does not parse ({_why(err)}); "
                               "fix or delete that key") from None


def value(kv: KV, kind: str) -> dict:
    """The JSON object stored at ``kv`` (a record read as stored); UnreadableRecord when it is not one."""
    try:
        data = json.loads(kv.value)
    except ValueError as err:
        raise UnreadableRecord(f"the {kind} record at {kv.key} does not parse ({_why(err)}); "
                               "fix or delete that key") from None
    if not isinstance(data, dict):
        raise UnreadableRecord(f"the {kind} record at {kv.key} is not a JSON object; fix or delete that key")
    return data


def skipped(kind: str, key: str) -> None:
    """Count (and log once) a record a list left out because it does not parse."""
    UNREADABLE.labels(kind).inc()
    with _lock:
        first = key not in _logged and len(_logged) < _LOGGED_MAX
        if first:
            _logged.add(key)
    if first:
        log.warning("skipping the %s record at %s: it does not parse", kind, key)


def each(model: type[M], kvs: Iterable[KV], kind: str) -> builtins.list[M]:
    """The records of ``kvs`` that parse, in order; each one that does not is skipped and counted."""
    return [rec for _kv, rec in pairs(model, kvs, kind)]


def pairs(model: type[M], kvs: Iterable[KV], kind: str) -> builtins.list[tuple[KV, M]]:
    """(kv, record) for each of ``kvs`` that parses (for readers that need its key or revision)."""
    out = []
    for kv in kvs:
        try:
            out.append((kv, parse(model, kv.value)))
        except ValueError:
            skipped(kind, kv.key)
    return out


def each_value(kvs: Iterable[KV], kind: str) -> builtins.list[tuple[KV, dict]]:
    """(kv, JSON object as stored) for each of ``kvs`` that holds one; the rest skipped and counted."""
    out = []
    for kv in kvs:
        try:
            data = json.loads(kv.value)
        except ValueError:
            data = None
        if isinstance(data, dict):
            out.append((kv, data))
        else:
            skipped(kind, kv.key)
    return out


def install(registry: CollectorRegistry) -> None:
    """Expose the counter on an app's registry (fabricd's and the gateway's /metrics); a registry
    that already has it (an app built twice on one state) keeps it."""
    try:
        registry.register(UNREADABLE)
    except ValueError:  # "Duplicated timeseries": already there
        pass
